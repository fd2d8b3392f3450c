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
# the unfinished one in $3 (with its checkpoint/, resumed by train-drafter) when $1 does not exist yet.
seed_run() {
  local run=$1 name; name=$(basename "$1")
  [ ! -f "$run/model/config.json" ] || return 0
  if [ -f "$2/$name/model/config.json" ]; then cp -r "$2/$name" "$(dirname "$run")/"
  elif [ ! -d "$run" ] && [ -d "$3/$name" ]; then cp -r "$3/$name" "$(dirname "$run")/"; fi
}
