#!/usr/bin/env bash
# The shipped SmolLM2 drafter on ExecuTorch, on an otherwise idle machine: export the pair as .pte programs
# twice (fp32; int4 = ExecuTorch's 8da4w target with int4 vocabulary tables), validate each, write each
# export's verify costs by width (the width rule reads them), then one bench on the frozen held-out chat set
# (two conversations of each category, 128 new tokens, greedy, 2 threads): the Python runtime on the same
# programs at fixed widths and under the rule, hyflash-run (the native runner) target-only and drafted on
# each, and onnxruntime-genai's int4 with its n-gram speculation in the same run.
# STAGES picks steps (default all): export validate costs bench; PTES the exports validate and costs take.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
E=${EXPORTS:-runs/exports}
R=research/smollm2-drafter/results
STAGES=${STAGES:-export validate costs bench}
PTES=${PTES:-smol-pte-fp32 smol-pte-int4}
has() { [[ " $STAGES " == *" $1 "* ]]; }
pair=(--target smollm2-135m-instruct --drafter smollm2-135m-instruct --force --format pte)
if has export; then
  $HF export "${pair[@]}" --out "$E/smol-pte-fp32"
  $HF export "${pair[@]}" --out "$E/smol-pte-int4" --quantize-target int4 --quantize-embeddings int4
fi
if has validate; then
  # the int4 export exits 1 on sampled-text agreement with fp32 below 0.9 (the int4 weights): the graph
  # checks are in the JSON either way
  for e in $PTES; do
    $HF validate "$E/$e" --json > "$R/validate_$e.json" || echo "validate $e: exit $?" >&2
  done
fi
if has costs; then
  for e in $PTES; do
    $HF profile "$E/$e" --backend executorch --contexts 256,1024 --repeats 15 --new-tokens 16 --threads 2 \
        --no-optimum --write-costs --out "$R/profile_shipped_$e.json"
  done
fi
if has bench; then
  $HF bench "$E/smol-pte-fp32" "$E/smol-pte-int4" --chat data/chat/heldout.jsonl --threads 2 --backend executorch \
      --per-category "${PER_CATEGORY:-2}" --widths "${WIDTHS:-full,4,rule}" --runner build/runtime_cpp/hyflash-run \
      --peer onnxruntime-genai --out docs/results/chat_bench_smollm2_pte.json
fi
