#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafters, from the feature cache of its own chat answers (make_data.sh, then
# `hyflash cache-features` for shards made before features were written in the same pass): HyFlash (Mamba-2
# memory + window 128; 14.43 M parameters of its own), and with the same data, steps and recipe the window
# drafter of equal parameter count (memory off, MLP 2,160 wide: 14.43 M) and Gated DeltaNet (15.62 M).
# Resumable (rerun to continue; STOP_AFTER=N ends a session's part at step N keeping the schedule of STEPS).
# Held-out tau is in each run's log.jsonl. Only HyFlash's weights ship.
# A second stage continues from shipped weights with a fresh schedule: INIT_FROM=smollm2-135m-instruct
# RUN=runs/smollm2-hyflash-2 STEPS=1000 LR=4e-4 WARMUP=50 (the run in docs/results-smollm2.md).
# NO_CACHE=1 runs the target on each batch instead (shards written with --no-features have no cache).
# LOOKUP=1 with INIT_FROM adds prompt-lookup's block as an input of the drafter it continues (new weights at
# zero): INIT_FROM=smollm2-135m-instruct LOOKUP=1 RUN=runs/smollm2-hyflash-lookup STEPS=600 LR=3e-4 WARMUP=20 NO_CACHE=1
# Both chat sets at once: DATA="data/chat/smollm2-regen data/chat/smollm2-regen-prose".
# HORIZON=N anchors only in each answer's first N tokens (the chat bench stops at 128 new tokens).
# GAMMA=G weighs slot k's loss exp(-(k-1)/G) (train-drafter's default 4).
# SOFT=S puts share S of each slot's loss on the target's whole distribution (soft labels, from the cache).
# SEED=N draws other batches and anchors (a continuation with the seed of the run it continues replays its batches).
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=.venv/bin/hyflash
DATA=${DATA:-data/chat/smollm2-regen}  # several folders, space-separated, train as one set
read -ra data <<< "$DATA"
STEPS=${STEPS:-3000}
VOCAB=${VOCAB:-16384}  # the draft vocabulary pilots chose 16K (docs/results-smollm2.md)
WHICH=${WHICH:-hyflash}
stop=${STOP_AFTER:+--stop-after $STOP_AFTER}
init=${INIT_FROM:+--init-from $INIT_FROM}
arch=(--draft-vocab "$VOCAB")
common=(--target smollm2-135m-instruct --data "${data[@]}" --steps "$STEPS" --batch 4
        --anchors 48 --lr "${LR:-1e-3}" --warmup "${WARMUP:-100}" --eval-every 100 --eval-rows 16
        --checkpoint-every 50 --threads "${THREADS:-2}" --device "${DEVICE:-cpu}" $stop $init
        ${NO_CACHE:+--no-feature-cache} ${LOOKUP:+--lookup-input} ${HORIZON:+--answer-horizon $HORIZON} ${GAMMA:+--slot-gamma $GAMMA}
        ${SOFT:+--soft-labels $SOFT} ${SEED:+--seed $SEED})
for name in $WHICH; do
  case $name in
    hyflash) if [ -n "${INIT_FROM:-}" ]; then  # the architecture comes with the weights
               $HF train-drafter "${common[@]}" --out "${RUN:-runs/smollm2-hyflash}"
             else
               $HF train-drafter "${common[@]}" "${arch[@]}" --out "${RUN:-runs/smollm2-hyflash}" --memory mamba2 --window 128
             fi ;;
    swa) $HF train-drafter "${common[@]}" "${arch[@]}" --out runs/smollm2-swa --memory off --window 128 \
           --intermediate-size "${SWA_INTERMEDIATE:-2160}" ;;
    gdn) $HF train-drafter "${common[@]}" "${arch[@]}" --out runs/smollm2-gdn --memory gated_deltanet --window 128 ;;
  esac
done
