#!/usr/bin/env bash
# SmolLM2-135M-Instruct's exact int4 exports side by side, on an idle machine: fp32 compute (the default) and
# int8 compute (--target-compute int8: steps through two rows), with the fp32 export beside them. Each is
# exported with the shipped drafter, validated (int8 compute: every verify row = the step at its position, bit
# for bit, on this machine), profiled by verify width at 256 and 1,024 committed tokens (the costs written
# beside the export for the width rule), then benched on the frozen held-out chat set (PER_CATEGORY
# conversations of each kind, 128 new tokens, greedy, 2 threads) under fixed widths and the rule, with
# onnxruntime-genai's int4 (its own builder, int8 compute) and its n-gram speculation in the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
E=${EXPORTS:-runs/exports}
R=research/int8-verify/results
STAGES=${STAGES:-export validate profile bench}
has() { [[ " $STAGES " == *" $1 "* ]]; }
common=(--target smollm2-135m-instruct --drafter smollm2-135m-instruct --format onnx --force)
if has export; then
  $HF export "${common[@]}" --out "$E/smol-hf-fp32"
  $HF export "${common[@]}" --out "$E/smol-hf-int4" --quantize-target int4 --quantize-embeddings int4
  $HF export "${common[@]}" --out "$E/smol-hf-int8c" --quantize-target int4 --quantize-embeddings int4 \
      --target-compute int8
fi
if has validate; then
  # exit 1 where int4's agreement with fp32 on sampled text is below --min-agreement (int4 weights, both
  # computes: research/int8-verify/agreement.py); the rows checks are what this script is after
  $HF validate "$E/smol-hf-int8c" --json > "$R/validate_smol-hf-int8c.json" || true
fi
if has profile; then
  for e in smol-hf-fp32 smol-hf-int4 smol-hf-int8c; do
    $HF profile "$E/$e" --contexts 256,1024 --repeats 15 --new-tokens 16 --threads 2 --no-optimum --write-costs \
        --out "$R/profile_$e.json"
  done
fi
if has bench; then
  $HF bench "$E/smol-hf-fp32" "$E/smol-hf-int4" "$E/smol-hf-int8c" --chat data/chat/heldout.jsonl --threads 2 \
      --per-category "${PER_CATEGORY:-2}" --widths "${WIDTHS:-full,4,rule}" --peer onnxruntime-genai \
      --out "$R/chat_bench_int8_compute.json"
fi
