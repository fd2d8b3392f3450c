#!/usr/bin/env bash
# The .pte target's verify block attending in one custom_sdpa call (the code of ONE_CALL, before the
# row-by-row fix) against row by row (today's), `hyflash profile` on each in turn, RUNS times, one
# sitting (this machine's speed drifts: only side-by-side ratios mean anything).
#   scripts/pte_verify_rows.sh   -> results/pte_verify_rows.json
# Both sides export the embedded pair in fp32 (runs/exports/pte-{one-call,row-by-row}, made once).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
ONE_CALL=b32ef8b  # the last commit whose target_verify attends the block in one call
PY=$PWD/.venv/bin/python
wt=$(mktemp -d)/one-call
git worktree add -q --detach "$wt" "$ONE_CALL"
trap 'git worktree remove --force "$wt"' EXIT
for d in models export runtime_py train; do ln -s "../$d" "$wt/hyflash/$d"; done  # the import layout
old() { (cd "$wt" && PYTHONPATH="$wt" "$PY" -m hyflash.cli "$@"); }
new() { "$PY" -m hyflash.cli "$@"; }
[ -f runs/exports/pte-one-call/manifest.json ] ||
  old export --target reference --drafter reference --out "$PWD/runs/exports/pte-one-call" --format pte --force
[ -f runs/exports/pte-row-by-row/manifest.json ] ||
  new export --target reference --drafter reference --out runs/exports/pte-row-by-row --format pte --force
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
json.dump(report, open("results/pte_verify_rows.json", "w"), indent=1)
print(f"executorch, median over {runs} alternating runs (ms): one call -> row by row")
for r in summary:
    v, d = r["target_verify"], r["target_decode"]
    print(f"  {r['context']:>5}: verify {v['one-call']:.2f} -> {v['row-by-row']:.2f} ({v['one-call'] / v['row-by-row']:.2f}x), "
          f"decode {d['one-call']:.2f} -> {d['row-by-row']:.2f}, verify/decode {r['verify_over_decode']['one-call']:.2f} -> "
          f"{r['verify_over_decode']['row-by-row']:.2f}")
PYEOF
