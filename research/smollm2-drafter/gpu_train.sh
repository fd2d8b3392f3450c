#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafters on one GPU, all three at once, sized to a wall-clock budget: HyFlash
# (Mamba-2 memory + window 128), the window drafter of equal parameter count (memory off, MLP 2,160) and
# Gated DeltaNet, with the target run on each batch (bf16 on the GPU) instead of a feature cache. A probe
# of a few steps of the three side by side measures seconds per step; the runs then get the steps that fit
# BUDGET seconds (their lr schedules end inside it); STEPS=N skips the probe. `cont` continues the shipped
# drafter (INIT_FROM, default the installed one) at lr 7e-4; `shipped` logs the shipped weights' held-out tau
# on the same rows (one step at lr 1e-12). Usage, on a machine with a GPU and the pulled target:
#   TARGET=~/.cache/hyflash/models/smollm2-135m-instruct BUDGET=300 research/smollm2-drafter/gpu_train.sh
# The run in docs/results-smollm2.md ("Training on a GPU"), 7.5 minutes on one H200:
#   TARGET=... STEPS=450 WHICH="cont hyflash swa shipped" EVAL_EVERY=50 INIT_FROM=prev \
#     research/smollm2-drafter/gpu_train.sh
# where prev is the drafter shipped before it: `git show d919aa2:hyflash/reference/drafter-smollm2/<file>`
# for config.json and model.safetensors (that run's cont became the fourth stage). LOOKUP=1 gives the fresh runs
# prompt-lookup's block as an input, as the shipped drafter has since its fifth stage (a fair window-drafter
# baseline for it); `cont` keeps the shipped drafter's own architecture.
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=${HF:-"python3 -m hyflash.cli"}
TARGET=${TARGET:?the SmolLM2-135M-Instruct folder}
BUDGET=${BUDGET:-300}
RUNS=${RUNS:-runs}
WHICH=${WHICH:-"hyflash swa gdn"}
INIT_FROM=${INIT_FROM:-smollm2-135m-instruct}
common=(--target "$TARGET" --data "${DATA:-data/chat/smollm2-regen}" --no-feature-cache --batch "${BATCH:-32}"
        --anchors 48 --eval-rows 64 --device "${DEVICE:-cuda}" --seed 0)
arch() {  # each run's architecture (or starting weights) and lr schedule
  local fresh=(--draft-vocab 16384 --window 128 --lr "${LR:-1e-3}" --warmup "${WARMUP:-100}" ${LOOKUP:+--lookup-input})
  case $1 in
    hyflash) echo "${fresh[@]}" --memory mamba2 ;;
    swa) echo "${fresh[@]}" --memory off --intermediate-size 2160 ;;
    gdn) echo "${fresh[@]}" --memory gated_deltanet ;;
    cont) echo --init-from "$INIT_FROM" --lr 7e-4 --warmup 50 ;;
  esac
}
t0=$(date +%s)
mkdir -p "$RUNS"
train=() shipped=""
for w in $WHICH; do if [ "$w" = shipped ]; then shipped=1; else train+=("$w"); fi; done
if [ -n "$shipped" ]; then  # one step at lr 1e-12: the held-out tau of the weights as they are
  $HF train-drafter "${common[@]}" --init-from "$INIT_FROM" --steps 1 --lr 1e-12 --warmup 1 --eval-every 1 \
    --out "$RUNS/smollm2-shipped-gpu" > "$RUNS/smollm2-shipped-gpu.log" 2>&1 &
fi
if [ -z "${STEPS:-}" ]; then
  for w in "${train[@]}"; do
    # shellcheck disable=SC2046
    $HF train-drafter "${common[@]}" $(arch "$w") --steps 100000 --stop-after 8 --eval-every 100000 \
      --out "/tmp/probe-$w" > "/tmp/probe-$w.log" 2>&1 &
  done
  wait
  steps=$(python3 - "$BUDGET" "$t0" "${train[@]}" <<'EOF'
import json, sys, time
budget, t0, runs = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
per = []
for w in runs:
    log = [json.loads(line) for line in open(f"/tmp/probe-{w}/log.jsonl")]
    per.append((log[6]["elapsed_s"] - log[1]["elapsed_s"]) / 5)  # steps 3-7: warmed up, before the final eval
left = budget - (time.time() - t0) - 45  # start-up, held-out evaluations, the final save
print(max(10, int(left / max(per))))
print(f"probe: {dict(zip(runs, [round(p, 3) for p in per]))} s/step side by side; {int(left / max(per))} steps fit",
      file=sys.stderr)
EOF
)
else steps=$STEPS; fi
echo "training ${train[*]} for $steps steps" >&2
every=${EVAL_EVERY:-$(( steps / 8 > 0 ? steps / 8 : 1 ))}
for w in "${train[@]}"; do
  # shellcheck disable=SC2046
  $HF train-drafter "${common[@]}" $(arch "$w") --steps "$steps" --eval-every "$every" \
    --checkpoint-every "$every" --out "$RUNS/smollm2-$w-gpu" > "$RUNS/smollm2-$w-gpu.log" 2>&1 &
done
wait
echo "done in $(( $(date +%s) - t0 )) s" >&2
