# Shared by the training scripts (sourced): run `$1 $2` and `$1 $3` side by side (word-split arguments);
# fail if either fails (a bare `wait` would not).
both() {
  local a b
  $1 $2 & a=$!
  $1 $3 & b=$!
  wait $a && wait $b
}

# Whether export folder $1 must be (re)made from drafter folder $2: no manifest yet, or a file of the drafter
# newer than it (retrained, or calibrated: hybrid.json is read at export).
stale_export() {
  [ ! -f "$1/manifest.json" ] || [ -n "$(find "$2" -newer "$1/manifest.json" -print -quit)" ]
}

# Seed run folder $1 from a committed copy: the finished run in $2 (its model/ written) if there is one, else
# the unfinished one in $3, if given (with its checkpoint/, resumed by train-drafter), when $1 does not exist yet.
seed_run() {
  local run=$1 name; name=$(basename "$1")
  [ ! -f "$run/model/config.json" ] || return 0
  if [ -f "$2/$name/model/config.json" ]; then cp -r "$2/$name" "$(dirname "$run")/"
  elif [ ! -d "$run" ] && [ -n "${3:-}" ] && [ -d "$3/$name" ]; then cp -r "$3/$name" "$(dirname "$run")/"; fi
}

# Export folder $1: the drafter folder $2 with the target $TARGET, ONNX, (again) when stale_export says so;
# further arguments are export flags.
export_drafter() {
  local out=$1 model=$2; shift 2
  ! stale_export "$out" "$model" || $H export --target "$TARGET" --drafter "$model" --out "$out" --format onnx --force "$@"
}

# The evidence probes (nearby / distant, fillers 256 / 768 / 1,536, ${PROBE_PROMPTS:-8} prompts each) into
# $1.json and $1.png, unless $1.json exists; then export folders and probe flags.
evidence_probe() {
  local f=$1; shift
  [ -f "$f.json" ] && return
  $H probe "$@" --distances 256,768,1536 --prompts "${PROBE_PROMPTS:-8}" --threads 2 --out "$f.partial.json" \
    --plot "$f.png"
  mv "$f.partial.json" "$f.json"
}
