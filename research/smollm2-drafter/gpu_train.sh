#!/usr/bin/env bash
# The SmolLM2-135M-Instruct drafters on one GPU, all three at once, sized to a wall-clock budget: HyFlash
# (Mamba-2 memory + window 128), the window drafter of equal parameter count (memory off, MLP 2,160) and
# Gated DeltaNet, with the target run on each batch (bf16 on the GPU) instead of a feature cache. A probe
# of a few steps of the three side by side measures seconds per step; the runs then get the steps that fit
# BUDGET seconds (their lr schedules end inside it). Usage, on a machine with a GPU and the pulled target:
#   TARGET=~/.cache/hyflash/models/smollm2-135m-instruct BUDGET=300 research/smollm2-drafter/gpu_train.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
HF=${HF:-"python3 -m hyflash.cli"}
TARGET=${TARGET:?the SmolLM2-135M-Instruct folder}
BUDGET=${BUDGET:-300}
RUNS=${RUNS:-runs}
WHICH=${WHICH:-"hyflash swa gdn"}
common=(--target "$TARGET" --data "${DATA:-data/chat/smollm2-regen}" --no-feature-cache --batch "${BATCH:-32}"
        --anchors 48 --lr "${LR:-1e-3}" --warmup "${WARMUP:-100}" --eval-rows 64 --draft-vocab 16384
        --device "${DEVICE:-cuda}" --seed 0)
arch() {
  case $1 in
    hyflash) echo --memory mamba2 --window 128 ;;
    swa) echo --memory off --window 128 --intermediate-size 2160 ;;
    gdn) echo --memory gated_deltanet --window 128 ;;
  esac
}
t0=$(date +%s)
mkdir -p "$RUNS"
for w in $WHICH; do
  # shellcheck disable=SC2046
  $HF train-drafter "${common[@]}" $(arch "$w") --steps 100000 --stop-after 8 --eval-every 100000 \
    --out "/tmp/probe-$w" > "/tmp/probe-$w.log" 2>&1 &
done
wait
steps=$(python3 - "$BUDGET" "$t0" $WHICH <<'EOF'
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
echo "training $WHICH for $steps steps" >&2
every=$(( steps / 8 > 0 ? steps / 8 : 1 ))
for w in $WHICH; do
  # shellcheck disable=SC2046
  $HF train-drafter "${common[@]}" $(arch "$w") --steps "$steps" --eval-every "$every" \
    --checkpoint-every "$every" --out "$RUNS/smollm2-$w-gpu" > "$RUNS/smollm2-$w-gpu.log" 2>&1 &
done
wait
echo "done in $(( $(date +%s) - t0 )) s" >&2
