#!/usr/bin/env bash
# A candidate SmolLM2 drafter (a training run's model/, not shipped) beside the shipped one, before shipping:
# calibrate the candidate on the held-in chat data, export both pairs as fp32 ONNX, write each export's
# verify costs, then one bench on the frozen held-out chat set (two conversations of each category, 128 new
# tokens, greedy, 2 threads) with every drafting mode at the full block, width 4 and under the rule, both
# exports side by side. Run on an otherwise idle machine.
#   CANDIDATE=runs/smollm2-hyflash-prose/model NAME=prose research/smollm2-drafter/compare_candidate.sh
# STAGES picks steps (default all): calibrate export costs bench. PER_CATEGORY=11 benches all 64 conversations;
# WIDTHS=full keeps the full block alone (a third of the time).
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
: "${CANDIDATE:?CANDIDATE=<the model folder of a training run>}" "${NAME:?NAME=<a short name for the candidate>}"
E=${EXPORTS:-runs/exports}
R=research/smollm2-drafter/results/candidate-$NAME
STAGES=${STAGES:-calibrate export costs bench}
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$R"
if has calibrate; then
  $HF calibrate --drafter "$CANDIDATE" --target smollm2-135m-instruct --data data/chat/smollm2-regen --rows 128 \
      --threads 2 --json > "$R/calibrate.json"
fi
if has export; then
  # the shipped pair exported anew: a folder left from before a ship would hold the weights before it
  $HF export --target smollm2-135m-instruct --drafter smollm2-135m-instruct --out "$E/smol-hf-fp32" --format onnx --force
  $HF export --target smollm2-135m-instruct --drafter "$CANDIDATE" --out "$E/smol-hf-fp32-$NAME" --format onnx --force
fi
if has costs; then
  for e in smol-hf-fp32 "smol-hf-fp32-$NAME"; do
    $HF profile "$E/$e" --contexts 256,1024 --repeats 15 --new-tokens 16 --threads 2 --no-optimum --write-costs \
        --out "$R/profile_$e.json"
  done
fi
if has bench; then
  $HF bench "$E/smol-hf-fp32" "$E/smol-hf-fp32-$NAME" --chat data/chat/heldout.jsonl --threads 2 \
      --per-category "${PER_CATEGORY:-2}" --widths "${WIDTHS:-full,4,rule}" --out "docs/results/chat_bench_smollm2_candidate_$NAME.json"
fi
