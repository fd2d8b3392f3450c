#!/usr/bin/env bash
# Draft-vocabulary pilots for the SmolLM2 drafter: the same HyFlash drafter trained STEPS steps from the feature
# cache with a head of 4K, 8K, 16K and 32K draft tokens, each exported (fp32 ONNX) and measured: held-out tau
# on chat (bench --chat on the first LIMIT conversations) and draft_read's ms (hyflash profile). Pick by the
# loop's speed. Resumable: a finished step is skipped. Run on an otherwise idle machine (the measurements).
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
DATA=${DATA:-data/chat/smollm2-regen}
STEPS=${STEPS:-300}
LIMIT=${LIMIT:-16}
OUT=research/smollm2-drafter/results
for V in ${VOCABS:-4096 8192 16384 32768}; do
  run=runs/smollm2-pilot-v$V
  [ -f "$run/model/model.safetensors" ] || $HF train-drafter --target smollm2-135m-instruct --data "$DATA" \
      --out "$run" --draft-vocab "$V" --steps "$STEPS" --batch 4 --anchors 48 --eval-every 50 --eval-rows 8 \
      --threads 2 --device cpu
  [ -f "runs/exports/smollm2-pilot-v$V/manifest.json" ] || $HF export --target smollm2-135m-instruct \
      --drafter "$run/model" --out "runs/exports/smollm2-pilot-v$V" --format onnx
  [ -f "$OUT/pilot_v$V.json" ] || $HF bench "runs/exports/smollm2-pilot-v$V" --chat data/chat/heldout.jsonl \
      --limit "$LIMIT" --threads 2 --out "$OUT/pilot_v$V.json" > /dev/null
  [ -f "$OUT/pilot_v${V}_profile.json" ] || $HF profile "runs/exports/smollm2-pilot-v$V" --contexts 256,1024 \
      --threads 2 --json > "$OUT/pilot_v${V}_profile.json"
done
