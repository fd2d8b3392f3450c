#!/usr/bin/env bash
# Issue 14, item 5: the four embedded drafters retrained for the second-generation target, on the recipe
# the ablation chose (research/results/ablation_regen.json): the target's own text, regenerated from training
# prompts (half greedy, half sampled at T = 1; anchors in the responses), the same architecture and
# sizes as generation one (window 128, MLP 512, Markov rank 32: under 40 MB with the target), training
# context 512, a larger budget: STEPS (3,000) for hyflash, swa and full, GDN_STEPS (2,000) for Gated
# DeltaNet (twice as slow a step). Two runs at a time, one thread each. Every step resumes where it
# stopped (checkpoints every 25 steps under $OUT): rerun the script to continue.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
source research/scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} OUT=${OUT:-runs/reference-v2} REGEN=${REGEN:-data/regen-v2}
DONE=${DONE:-checkpoints/drafters-v2}  # finished runs, committed: copied into $OUT instead of retrained
PARTIAL=${PARTIAL:-checkpoints/drafters-v2-partial}  # unfinished runs, committed at a session's end: resumed
STEPS=${STEPS:-3000} GDN_STEPS=${GDN_STEPS:-2000} TOKENS=${TOKENS:-1000000}
mkdir -p "$OUT"
[ -f data/corpus/train.txt ] || $H corpus --out data/corpus

# 7,872 sequences of 512 tokens (1 M response tokens; 29 min on 2 threads, 85 on a slower machine):
# 3,000 steps x 4 sequences see each about 1.5 times. Committed in $REGEN (16 MB): a rerun checks every
# shard's checksum and regenerates nothing.
$H regenerate --target "$TARGET" --prompts-from data/corpus --out "$REGEN" --tokens "$TOKENS" --batch 64 \
  --greedy-share 0.5 --temperature 1.0 --prompt-len 64..384 --seq-len 512 --threads 2 2>> "$OUT/regen.log"

drafter() {  # name, steps, then train-drafter flags; a finished run (its model/ written) is left alone
  local name=$1 steps=$2 run=$OUT/drafter-$1; shift 2
  seed_run "$run" "$DONE" "$PARTIAL"  # a committed run, finished or to resume, seeds $OUT
  [ -f "$run/model/config.json" ] && return
  $H train-drafter --target "$TARGET" --data "$REGEN" --out "$OUT/drafter-$name" "$@" \
    --intermediate-size 512 --markov-rank 32 --steps "$steps" --batch 4 --threads 1 >> "$OUT/drafter-$name.log" 2>&1
}
both drafter "hyflash $STEPS --memory mamba2 --window 128" "swa $STEPS --memory off --window 128"
both drafter "gdn $GDN_STEPS --memory gated_deltanet --window 128" "full $STEPS --memory off --window full"

# hybrid drafting's constants for the HyFlash drafter, from the regenerated training text (never bench prompts)
[ -f "$OUT/drafter-hyflash/model/hybrid.json" ] ||
  $H calibrate --drafter "$OUT/drafter-hyflash/model" --target "$TARGET" --data "$REGEN" --threads 2 \
    --plot "$OUT/drafter-hyflash/reliability.png" --json > "$OUT/drafter-hyflash/calibration.json"

# then: RUNS=runs/reference-v2 TARGET_SRC=checkpoints/target-v3h-copy6 research/scripts/drafter_card.sh installs the target
# and the four drafters as the embedded pair and measures them (greedy and T = 1)
