#!/usr/bin/env bash
# Draft-vocabulary pilots for the SmolLM2 drafter: the same HyFlash drafter trained STEPS steps from the feature
# cache with a head of 4K, 8K, 16K and 32K draft tokens, each exported (fp32 ONNX) and measured: held-out tau
# (the training log's, on held-out conversations of the chat data), draft_read's ms (hyflash profile) and,
# with LIMIT > 0, tau and tokens/s on chat (bench --chat on the first LIMIT held-out conversations); then the
# vocabularies' coverage of the target's answers and one table
# (summarize_pilots.py -> results/vocab_pilots.json). Pick by the loop's speed. Resumable: a finished step is
# skipped. Run on an otherwise idle machine (the measurements).
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
DATA=${DATA:-data/chat/smollm2-regen}
STEPS=${STEPS:-120}
LIMIT=${LIMIT:-0}
OUT=research/smollm2-drafter/results
mkdir -p "$OUT"
for V in ${VOCABS:-4096 8192 16384 32768}; do
  run=runs/smollm2-pilot-v$V
  [ -f "$run/model/model.safetensors" ] || $HF train-drafter --target smollm2-135m-instruct --data "$DATA" \
      --out "$run" --draft-vocab "$V" --steps "$STEPS" --batch 4 --anchors 48 --eval-every 40 --eval-rows 12 \
      --threads 2 --device cpu
  [ -f "runs/exports/smollm2-pilot-v$V/manifest.json" ] || $HF export --target smollm2-135m-instruct \
      --drafter "$run/model" --out "runs/exports/smollm2-pilot-v$V" --format onnx
  [ "$LIMIT" = 0 ] || [ -f "$OUT/pilot_v$V.json" ] || $HF bench "runs/exports/smollm2-pilot-v$V" --chat data/chat/heldout.jsonl \
      --limit "$LIMIT" --threads 2 --out "$OUT/pilot_v$V.json" > /dev/null
  [ -f "$OUT/pilot_v${V}_profile.json" ] || $HF profile "runs/exports/smollm2-pilot-v$V" --contexts 256,1024 \
      --repeats 20 --new-tokens 16 --no-optimum --threads 2 --out "$OUT/pilot_v${V}_profile.json" > /dev/null
done
.venv/bin/python research/smollm2-drafter/summarize_pilots.py --data "$DATA" --runs runs --results "$OUT"
