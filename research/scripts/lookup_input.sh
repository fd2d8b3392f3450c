#!/usr/bin/env bash
# Issue 14 ("find what does"): HyFlash with prompt-lookup's block as an input (`--lookup-input`), against
# the same drafter without it, at equal steps and data: the 1,500-step HyFlash of research/scripts/long_range.sh
# (checkpoints/long-range/drafter-hyflash-base: the second-generation target, data/regen-v2, window 128,
# MLP 512, Markov rank 32, batch 4, seed 0) and the same run with --lookup-input.
# Then both exported and benched side by side with prompt-lookup and hybrid drafting, greedy and at T = 1
# (research/results/lookup_input.json, lookup_input_t1.json, with plots). Then the same drafter at the embedded
# drafters' budget (EMBED_STEPS, 3,000: runs/reference-v2/drafter-hyflash-lookup, committed in
# checkpoints/drafters-v2), calibrated, for `HYFLASH_RUN=runs/reference-v2/drafter-hyflash-lookup
# RUNS=runs/reference-v2 research/scripts/drafter_card.sh` to install as the embedded HyFlash drafter. With MORE_STEPS
# (2,500 for the embedded one), that run continued from its weights on a fresh schedule (`--init-from`, lr MORE_LR,
# default 5e-4): runs/reference-v2/drafter-hyflash-lookup-more, committed in checkpoints/drafters-v2.
# Last, issue 15's question with copying handled: the window drafter with the lookup input and HyFlash's
# parameter count (memory off, MLP 816, as long_range.sh's swa-matched), against the HyFlash one, on the
# ordinary bench and the evidence probes (${RESULT}_window.json, ${RESULT}_window_probe.json).
# Every step resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
source research/scripts/lib.sh
TARGET=${TARGET:-checkpoints/target-v3h-copy6} REGEN=${REGEN:-data/regen-v2} OUT=${OUT:-runs/lookup-input}
STEPS=${STEPS:-1500} THREADS=${THREADS:-2} PROMPTS=${PROMPTS:-16} RESULT=${RESULT:-research/results/lookup_input}
DONE=${DONE:-checkpoints/lookup-input}  # the finished run, committed: copied, not retrained
PARTIAL=${PARTIAL:-checkpoints/lookup-input-partial}  # an unfinished one, committed at a session's end: resumed
BASE=${BASE:-checkpoints/long-range/drafter-hyflash-base}
mkdir -p "$OUT" results
EMBED_STEPS=${EMBED_STEPS:-3000} EMBED=${EMBED:-runs/reference-v2}
EMBED_DONE=${EMBED_DONE:-checkpoints/drafters-v2} EMBED_PARTIAL=${EMBED_PARTIAL:-checkpoints/drafters-v2-partial}
train() {  # run folder, steps, finished copies, unfinished copies[, flags that override]: with the lookup input
  local run=$1 steps=$2; seed_run "$1" "$3" "$4"; shift 4
  [ -f "$run/model/config.json" ] ||
    $H train-drafter --target "$TARGET" --data "$REGEN" --out "$run" --memory mamba2 --intermediate-size 512 \
      --window 128 --markov-rank 32 --steps "$steps" --batch 4 --threads "$THREADS" --lookup-input "$@" \
      >> "$run.log" 2>&1
}
calibrate() {  # run folder: hybrid.json from the regenerated training text (never bench prompts)
  [ -f "$1/model/hybrid.json" ] ||
    $H calibrate --drafter "$1/model" --target "$TARGET" --data "$REGEN" --threads 2 \
      --plot "$1/reliability.png" --json > "$1/calibration.json"
}
if [ -n "${EMBED_ONLY:-}" ]; then  # the embedded budget's run alone
  mkdir -p "$EMBED"
  train "$EMBED/drafter-hyflash-lookup" "$EMBED_STEPS" "$EMBED_DONE" "$EMBED_PARTIAL"
  calibrate "$EMBED/drafter-hyflash-lookup"
  # MORE_STEPS: that run continued from its weights with a fresh schedule (a warm restart at MORE_LR)
  if [ -n "${MORE_STEPS:-}" ]; then
    run=$EMBED/drafter-hyflash-lookup-more; seed_run "$run" "$EMBED_DONE" "$EMBED_PARTIAL"
    [ -f "$run/model/config.json" ] ||
      $H train-drafter --target "$TARGET" --data "$REGEN" --out "$run" --init-from "$EMBED/drafter-hyflash-lookup/model" \
        --steps "$MORE_STEPS" --lr "${MORE_LR:-5e-4}" --batch 4 --threads "$THREADS" --seed 1 >> "$run.log" 2>&1
    calibrate "$run"
  fi
  exit 0
fi
train "$OUT/drafter-hyflash-lookup" "$STEPS" "$DONE" "$PARTIAL"
[ -z "${TRAIN_ONLY:-}" ] || exit 0
[ -f "$OUT/drafter-hyflash-base/model/config.json" ] || cp -r "$BASE" "$OUT/drafter-hyflash-base"

# hybrid drafting's constants for both, from the regenerated training text (never bench prompts), then exports
for name in hyflash-base hyflash-lookup; do
  run=$OUT/drafter-$name
  calibrate "$run"
  export_drafter "$OUT/export-$name" "$run/model"
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

# the window drafter with the lookup input, at HyFlash's parameter count
train "$OUT/drafter-swa-lookup" "$STEPS" "$DONE" "$PARTIAL" --memory off --intermediate-size 816
export_drafter "$OUT/export-swa-lookup" "$OUT/drafter-swa-lookup/model"
[ -f "${RESULT}_window.json" ] || {
  $H bench "$OUT"/export-{hyflash,swa}-lookup --buckets 256,512,1024,2048 --prompts-per-bucket "$PROMPTS" \
    --max-new-tokens 64 --seed 0 --threads 2 --json > "${RESULT}_window.json.partial"
  mv "${RESULT}_window.json.partial" "${RESULT}_window.json"; }
evidence_probe "${RESULT}_window_probe" "$OUT"/export-{hyflash,swa}-lookup
