# Shared by the training scripts (sourced): run `$1 $2` and `$1 $3` side by side (word-split arguments);
# fail if either fails (a bare `wait` would not).
both() {
  local a b
  $1 $2 & a=$!
  $1 $3 & b=$!
  wait $a && wait $b
}
