#!/usr/bin/env bash
# Issue 13's speed figures: today's graphs against the format-1 graphs, `hyflash profile` on each in
# turn, RUNS times, on one machine in one sitting (this machine's speed drifts by 30% from one
# minute to the next, so a ratio is only meaningful between runs made side by side).
#   research/scripts/profile_vs_baseline.sh [onnxruntime|executorch]     -> research/results/profile_vs_baseline_<backend>.json
# The format-1 side runs the code of the commit that measured research/results/profile_baseline.json, from a
# temporary git worktree, on its own export of the reference pair (made once, under runs/exports/).
set -euo pipefail
cd "$(dirname "$0")/../.."
BACKEND=${1:-onnxruntime}
RUNS=${RUNS:-3}
BASE=03363dd  # "hyflash profile ...; research/results/profile_baseline.json" (format 1)
PY=$PWD/.venv/bin/python
fmt=$([ "$BACKEND" = executorch ] && echo pte || echo onnx)
wt=$(mktemp -d)/format1
git worktree add -q --detach "$wt" "$BASE"
trap 'git worktree remove --force "$wt"' EXIT
for d in models export runtime_py train; do ln -s "../$d" "$wt/hyflash/$d"; done  # its import layout
old() { (cd "$wt" && PYTHONPATH="$wt" "$PY" -m hyflash.cli "$@"); }
new() { "$PY" -m hyflash.cli "$@"; }
[ -f "runs/exports/format1-$fmt/manifest.json" ] ||
  old export --target reference --drafter reference --out "$PWD/runs/exports/format1-$fmt" --format "$fmt" --force
[ -f "runs/exports/format2-$fmt/manifest.json" ] ||
  new export --target reference --drafter reference --out "runs/exports/format2-$fmt" --format "$fmt" --force
out=$(mktemp -d)
for i in $(seq "$RUNS"); do
  old profile "$PWD/runs/exports/format1-$fmt" --backend "$BACKEND" --threads 2 --no-optimum --json > "$out/old-$i.json"
  new profile "runs/exports/format2-$fmt" --backend "$BACKEND" --threads 2 --no-optimum --json > "$out/new-$i.json"
done
"$PY" - "$out" "$RUNS" "$BACKEND" <<'EOF'
import json, statistics, sys
out, runs, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
report = {"backend": backend, "runs": runs, "threads": 2, "format1": [], "format2": []}
for i in range(1, runs + 1):
    for side, name in (("format1", "old"), ("format2", "new")):
        report[side].append(json.load(open(f"{out}/{name}-{i}.json")))
def med(side, c, key, graph=None):
    rows = [next(r for r in run["rows"] if r["context"] == c) for run in report[side]]
    return statistics.median(r["graph_ms"][graph] if graph else r[key] for r in rows)
contexts = [r["context"] for r in report["format2"][0]["rows"]]
summary = []
for c in contexts:
    row = {"context": c}
    for g in ("target_decode", "target_verify", "target_prefill", "draft_read", "state_commit", "window_shift"):
        row[g] = {"format1_ms": med("format1", c, None, g), "format2_ms": med("format2", c, None, g)}
        row[g]["faster"] = row[g]["format1_ms"] / row[g]["format2_ms"]
    for key in ("verify_over_decode", "drafter_ms_per_round", "ttft_ms", "prefill_tokens_per_s", "target_only_tokens_per_s"):
        row[key] = {"format1": med("format1", c, key), "format2": med("format2", c, key)}
    summary.append(row)
report["median_over_runs"] = summary
json.dump(report, open(f"research/results/profile_vs_baseline_{backend}.json", "w"), indent=1)
print(f"{backend}: median over {runs} alternating runs, format 1 -> format 2 (ms)")
for r in summary:
    print(f"  {r['context']:>5}: decode {r['target_decode']['format1_ms']:.2f} -> {r['target_decode']['format2_ms']:.2f} "
          f"({r['target_decode']['faster']:.2f}x), verify {r['target_verify']['format1_ms']:.2f} -> "
          f"{r['target_verify']['format2_ms']:.2f} ({r['target_verify']['faster']:.2f}x), verify/decode "
          f"{r['verify_over_decode']['format2']:.2f}, drafter/round {r['drafter_ms_per_round']['format1']:.2f} -> "
          f"{r['drafter_ms_per_round']['format2']:.2f}, target-only tok/s {r['target_only_tokens_per_s']['format1']:.0f} -> "
          f"{r['target_only_tokens_per_s']['format2']:.0f}")
EOF
