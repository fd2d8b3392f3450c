#!/usr/bin/env bash
# Issue 14 ("find what does"): HyFlash with prompt-lookup's block as an input (`--lookup-input`), against
# the same drafter without it, at equal steps and data: the 1,500-step HyFlash of scripts/long_range.sh
# (checkpoints/long-range/drafter-hyflash-base: the second-generation target, data/regen-v2, window 128,
# MLP 512, Markov rank 32, batch 4, seed 0) and the same run with --lookup-input.
# Then both exported and benched side by side with prompt-lookup and hybrid drafting, greedy and at T = 1
# (results/lookup_input.json, lookup_input_t1.json, with plots). Every step resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
H=.venv/bin/hyflash
source scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} REGEN=${REGEN:-data/regen-v2} OUT=${OUT:-runs/lookup-input}
STEPS=${STEPS:-1500} THREADS=${THREADS:-2} PROMPTS=${PROMPTS:-16} RESULT=${RESULT:-results/lookup_input}
DONE=${DONE:-checkpoints/lookup-input}  # the finished run, committed: copied, not retrained
PARTIAL=${PARTIAL:-checkpoints/lookup-input-partial}  # an unfinished one, committed at a session's end: resumed
BASE=${BASE:-checkpoints/long-range/drafter-hyflash-base}
mkdir -p "$OUT" results
seed_run "$OUT/drafter-hyflash-lookup" "$DONE" "$PARTIAL"
[ -f "$OUT/drafter-hyflash-lookup/model/config.json" ] ||
  $H train-drafter --target "$TARGET" --data "$REGEN" --out "$OUT/drafter-hyflash-lookup" --memory mamba2 \
    --intermediate-size 512 --window 128 --markov-rank 32 --steps "$STEPS" --batch 4 --threads "$THREADS" \
    --lookup-input >> "$OUT/drafter-hyflash-lookup.log" 2>&1
[ -z "${TRAIN_ONLY:-}" ] || exit 0
