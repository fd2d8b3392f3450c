#!/usr/bin/env bash
# A .pte verify block's rows against the decode steps at their positions (scripts/pte_verify_drift.py),
# with the block attending in one custom_sdpa call (the code of ONE_CALL) and row by row (today's), for
# the embedded pair with an fp32 target and with an int4 (8da4w) target.
#   scripts/pte_verify_drift.sh   -> results/pte_verify_drift.json
# Exports are made once under runs/exports/ (the fp32 pair shared with scripts/pte_verify_rows.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ONE_CALL=b32ef8b  # the last commit whose target_verify attends the block in one call
PY=$PWD/.venv/bin/python
wt=$(mktemp -d)/one-call
git worktree add -q --detach "$wt" "$ONE_CALL"
trap 'git worktree remove --force "$wt"' EXIT
for d in models export runtime_py train; do ln -s "../$d" "$wt/hyflash/$d"; done  # the import layout
old() { (cd "$wt" && PYTHONPATH="$wt" "$PY" -m hyflash.cli "$@"); }
new() { "$PY" -m hyflash.cli "$@"; }
ex() {  # side folder [export flags]
  local side=$1 folder=$2; shift 2
  [ -f "$folder/manifest.json" ] || $side export --target reference --drafter reference --format pte --force \
    --out "$PWD/$folder" "$@"
}
ex old runs/exports/pte-one-call
ex new runs/exports/pte-row-by-row
ex old runs/exports/pte-int4-target-one-call --quantize-target int4
ex new runs/exports/pte-int4-target --quantize-target int4
"$PY" scripts/pte_verify_drift.py fp32-one-call=runs/exports/pte-one-call fp32-row-by-row=runs/exports/pte-row-by-row \
  int4-one-call=runs/exports/pte-int4-target-one-call int4-row-by-row=runs/exports/pte-int4-target \
  --out results/pte_verify_drift.json
