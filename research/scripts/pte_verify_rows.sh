#!/usr/bin/env bash
# The .pte target's verify block attending in one custom_sdpa call (the code of ONE_CALL, before the
# row-by-row fix) against row by row (today's), on the embedded pair:
# - how far a verify row is from its decode step, fp32 and int4 (8da4w) targets
#   (research/scripts/pte_verify_drift.py)                                   -> research/results/pte_verify_drift.json
# - `hyflash profile` of the fp32 pair, each side in turn, RUNS times, one sitting (this machine's
#   speed drifts: only side-by-side ratios mean anything)           -> research/results/pte_verify_rows.json
# Exports are made once, under runs/exports/pte-*.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-2}
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
[ -f research/results/pte_verify_drift.json ] ||
  "$PY" research/scripts/pte_verify_drift.py fp32-one-call=runs/exports/pte-one-call fp32-row-by-row=runs/exports/pte-row-by-row \
    int4-one-call=runs/exports/pte-int4-target-one-call int4-row-by-row=runs/exports/pte-int4-target \
    --out research/results/pte_verify_drift.json
out=$(mktemp -d)
for i in $(seq "$RUNS"); do
  new profile runs/exports/pte-one-call --backend executorch --threads 2 --no-optimum --json > "$out/one-call-$i.json"
  new profile runs/exports/pte-row-by-row --backend executorch --threads 2 --no-optimum --json > "$out/row-by-row-$i.json"
done
"$PY" - "$out" "$RUNS" <<'PYEOF'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
sides = ("one-call", "row-by-row")
report = {"backend": "executorch", "runs": runs, "threads": 2,
          **{s: [json.load(open(f"{out}/{s}-{i}.json")) for i in range(1, runs + 1)] for s in sides}}
summary = []
for c in [r["context"] for r in report["row-by-row"][0]["rows"]]:
    row = {"context": c}
    for g in ("target_decode", "target_verify"):
        row[g] = {s: statistics.median(next(r for r in run["rows"] if r["context"] == c)["graph_ms"][g]
                                       for run in report[s]) for s in sides}
    row["verify_over_decode"] = {s: row["target_verify"][s] / row["target_decode"][s] for s in sides}
    summary.append(row)
report["median_over_runs"] = summary
json.dump(report, open("research/results/pte_verify_rows.json", "w"), indent=1)
print(f"executorch, median over {runs} alternating runs (ms): one call -> row by row")
for r in summary:
    v, d = r["target_verify"], r["target_decode"]
    print(f"  {r['context']:>5}: verify {v['one-call']:.2f} -> {v['row-by-row']:.2f} ({v['one-call'] / v['row-by-row']:.2f}x), "
          f"decode {d['one-call']:.2f} -> {d['row-by-row']:.2f}, verify/decode {r['verify_over_decode']['one-call']:.2f} -> "
          f"{r['verify_over_decode']['row-by-row']:.2f}")
PYEOF
