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
[ -f "$OUT/drafter-hyflash-base/model/config.json" ] || cp -r "$BASE" "$OUT/drafter-hyflash-base"

# hybrid drafting's constants for both, from the regenerated training text (never bench prompts), then exports
for name in hyflash-base hyflash-lookup; do
  run=$OUT/drafter-$name
  [ -f "$run/model/hybrid.json" ] ||
    $H calibrate --drafter "$run/model" --target "$TARGET" --data "$REGEN" --threads 2 \
      --plot "$run/reliability.png" --json > "$run/calibration.json"
  ! stale_export "$OUT/export-$name" "$run/model" ||
    $H export --target "$TARGET" --drafter "$run/model" --out "$OUT/export-$name" --format onnx --force
done
# side by side in one run per temperature (prompt-lookup, hybrid and target-only rows come with them)
for t in 0 1; do
  out=$RESULT$([ "$t" = 0 ] || echo "_t$t")
  [ -f "$out.json" ] && continue
  $H bench "$OUT"/export-hyflash-{base,lookup} --buckets 256,512,1024,2048 --prompts-per-bucket "$PROMPTS" \
    --max-new-tokens 64 --temperature "$t" --seed 0 --threads 2 --plot "$out.png" --json > "$out.json.partial"
  mv "$out.json.partial" "$out.json"
  .venv/bin/python -c "
import json; from hyflash.runtime_py.bench import format_results
print(format_results(json.load(open('$out.json'))))"
done
