#!/usr/bin/env bash
# The shipped SmolLM2 pair in fp16 on ONNX (`export --dtype fp16`: weights, I/O and KV cache in float16),
# on an otherwise idle machine: export it beside the fp32 export, validate each graph against the fp32 eager
# models (fp16 tolerances, design.md "Validation"), then one bench on the frozen held-out chat set (two
# conversations of each category, 128 new tokens, greedy, 2 threads, full block) with both exports side by
# side: τ on fp16 against fp32, and every drafted answer against its own export's target-only answer.
# STAGES picks steps (default all): export validate bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
E=${EXPORTS:-runs/exports}
R=research/smollm2-drafter/results
STAGES=${STAGES:-export validate bench}
has() { [[ " $STAGES " == *" $1 "* ]]; }
pair=(--target smollm2-135m-instruct --drafter smollm2-135m-instruct --format onnx --force)
if has export; then
  $HF export "${pair[@]}" --out "$E/smol-hf-fp32"
  $HF export "${pair[@]}" --out "$E/smol-hf-fp16" --dtype fp16
fi
if has validate; then
  $HF validate "$E/smol-hf-fp16" --json > "$R/validate_smol-hf-fp16.json" || echo "validate fp16: exit $?" >&2
fi
if has bench; then
  $HF bench "$E/smol-hf-fp32" "$E/smol-hf-fp16" --chat data/chat/heldout.jsonl --threads 2 \
      --per-category "${PER_CATEGORY:-2}" --widths full --out docs/results/chat_bench_smollm2_fp16.json
fi
