#!/usr/bin/env bash
# After train_drafters.sh: ship the HyFlash drafter as the installation's `smollm2-135m-instruct` drafter
# (bf16, hyflash/reference/drafter-smollm2), calibrate hybrid on the held-in chat data, export the pair
# (fp32 ONNX + .pte, int4 ONNX), validate, and measure on the frozen held-out chat set, hyflash-run beside
# the Python runtime. Run on an otherwise idle machine: the bench is the speed figure.
# STAGES picks steps (default all): ship calibrate export validate costs bench. costs: this machine's verify-width
# costs beside each ONNX export (`profile --write-costs`), which the bench's `--widths ... rule` reads;
# WIDTHS=full,2,4,rule runs every drafting mode under each policy side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
RUN=${RUN:-runs/smollm2-hyflash}
SHIP=hyflash/reference/drafter-smollm2
EXPORTS=${EXPORTS:-runs/exports}
STAGES=${STAGES:-ship calibrate export validate costs bench}
OUT=${OUT:-docs/results/chat_bench_smollm2_hyflash.json}
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has ship; then
  test -f "$RUN/model/model.safetensors" || { echo "no trained drafter in $RUN/model" >&2; exit 2; }
  rm -rf "$SHIP.tmp" && cp -r "$RUN/model" "$SHIP.tmp" && rm -rf "$SHIP" && mv "$SHIP.tmp" "$SHIP"
  cp "$RUN/log.jsonl" research/smollm2-drafter/results/hyflash_log.jsonl
  cp "$RUN/run_config.json" research/smollm2-drafter/results/hyflash_run_config.json
fi
if has calibrate; then
  $HF calibrate --drafter smollm2-135m-instruct --target smollm2-135m-instruct --data data/chat/smollm2-regen \
      --rows "${ROWS:-128}" --threads 2 --plot research/smollm2-drafter/results/hybrid_reliability.png
fi
if has export; then
  $HF export --target smollm2-135m-instruct --drafter smollm2-135m-instruct --out "$EXPORTS/smol-hf-fp32" \
      --format "${FP32_FORMAT:-both}" --force
  $HF export --target smollm2-135m-instruct --drafter smollm2-135m-instruct --out "$EXPORTS/smol-hf-int4" \
      --format onnx --quantize-target int4 --quantize-embeddings int4 --force
fi
if has validate; then
  $HF validate "$EXPORTS/smol-hf-fp32" --json > research/smollm2-drafter/results/validate_fp32.json
  $HF validate "$EXPORTS/smol-hf-int4" --json > research/smollm2-drafter/results/validate_int4.json
fi
if has costs; then
  for e in smol-hf-fp32 smol-hf-int4; do
    $HF profile "$EXPORTS/$e" --contexts 256,1024 --repeats 15 --new-tokens 16 --threads 2 --no-optimum \
        --write-costs --out "research/smollm2-drafter/results/profile_$e.json"
  done
fi
if has bench; then
  runner=${RUNNER-build/runtime_cpp/hyflash-run}
  $HF bench "$EXPORTS/smol-hf-fp32" "$EXPORTS/smol-hf-int4" --chat data/chat/heldout.jsonl --threads 2 \
      ${runner:+--runner $runner} --out "$OUT" ${LIMIT:+--limit $LIMIT} ${PER_CATEGORY:+--per-category $PER_CATEGORY} \
      ${WIDTHS:+--widths $WIDTHS}
fi
