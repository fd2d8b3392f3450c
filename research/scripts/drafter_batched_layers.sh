#!/usr/bin/env bash
# Issue 13: the drafter's commit graphs with all layers in one set of ops (state_commit 115 -> 67 nodes,
# window_shift 67 -> 44 on the reference drafter), measured against the per-layer graphs side by side:
# `hyflash profile` on both exports, alternating, RUNS times each, 2 threads; the machine otherwise idle
# (pause anything else). BEFORE is an export made at the commit before the change (research/scripts/at_commit.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
BEFORE=${BEFORE:-runs/exports/s6-before} AFTER=${AFTER:-runs/exports/s6-after} RUNS=${RUNS:-3}
[ -f "$AFTER/manifest.json" ] || $H export --target reference --drafter reference --out "$AFTER" --format onnx
out=research/results/drafter_batched_layers.json
tmp=$(mktemp -d)
for i in $(seq "$RUNS"); do
  for tag in before after; do
    folder=$BEFORE; [ $tag = after ] && folder=$AFTER
    $H profile "$folder" --contexts 256,1024,2048 --threads 2 --no-optimum --json > "$tmp/$tag-$i.json"
  done
done
.venv/bin/python - "$tmp" "$RUNS" "$out" <<'PY'
import json, statistics, sys
tmp, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
report = {"runs": runs, "threads": 2, "before": [], "after": []}
for tag in ("before", "after"):
    report[tag] = [json.load(open(f"{tmp}/{tag}-{i}.json")) for i in range(1, runs + 1)]
rows = []
for j, row in enumerate(report["after"][0]["rows"]):
    cell = {"context": row["context"]}
    for tag in ("before", "after"):
        med = lambda f: statistics.median(f(r["rows"][j]) for r in report[tag])
        cell[tag] = {g: med(lambda r: r["graph_ms"][g]) for g in ("draft_read", "state_commit", "window_shift")}
        cell[tag]["drafter_ms_per_round"] = med(lambda r: r["drafter_ms_per_round"])
    rows.append(cell)
report["summary"] = rows
json.dump(report, open(out, "w"), indent=1)
print("| committed tokens | state_commit ms | window_shift ms | draft_read ms | drafter ms a round |")
print("|---|---|---|---|---|")
for c in rows:
    b, a = c["before"], c["after"]
    print(f"| {c['context']:,} | " + " | ".join(f"{b[g]:.3f} -> {a[g]:.3f}" for g in
          ("state_commit", "window_shift", "draft_read", "drafter_ms_per_round")) + " |")
PY
