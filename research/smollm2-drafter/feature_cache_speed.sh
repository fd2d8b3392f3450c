#!/usr/bin/env bash
# Training steps/s of the SmolLM2 drafter with the feature cache against with the target in the loop:
# the same data, rows, seed and drafter, STEPS steps each, 2 threads. Run on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
DATA=${DATA:-data/chat/smollm2-regen}
STEPS=${STEPS:-8}
OUT=research/smollm2-drafter/results/feature_cache_speed.json
for mode in cache target; do
  rm -rf "runs/cache-speed-$mode"
  flag=$([ "$mode" = target ] && echo --no-feature-cache || true)
  $HF train-drafter --target smollm2-135m-instruct --data "$DATA" --out "runs/cache-speed-$mode" $flag \
    --steps "$STEPS" --batch 4 --anchors 48 --eval-every 1000 --eval-rows 1 --threads 2 --device cpu
done
.venv/bin/python - "$OUT" <<'PY'
import json, statistics, sys, time
from pathlib import Path
out = {"date": time.strftime("%Y-%m-%d"), "steps": None, "batch": 4, "anchors": 48, "threads": 2}
for mode in ("cache", "target"):
    log = [json.loads(l) for l in Path(f"runs/cache-speed-{mode}/log.jsonl").read_text().splitlines()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(log, log[1:])]  # the first step warms up
    out["steps"] = len(log)
    out[mode] = {"median_step_s": statistics.median(times), "steps_per_s": 1 / statistics.median(times),
                 "loss_first": log[0]["loss"], "loss_last": log[-1]["loss"]}
out["gain"] = out["cache"]["steps_per_s"] / out["target"]["steps_per_s"]
Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out))
PY
