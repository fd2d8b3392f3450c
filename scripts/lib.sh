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
