#!/usr/bin/env bash
# Issues 14 and 15, first drafters for the second-generation target: the target's own text (regenerated
# from training prompts, half greedy, half sampled at T = 1), then the HyFlash drafter (Mamba-2 memory +
# window 128) and the sliding-window drafter (memory off, the same window) trained on it with one recipe
# and budget (STEPS x 4 sequences x 512 tokens, both at once, one thread each), exported, and measured on
# the distant / nearby evidence probes beside prompt-lookup and the history-limited ablation. A smaller
# budget than the embedded drafters' (the cores are shared with other work); every step resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
TARGET=${TARGET:-checkpoints/target-v3} STEPS=${STEPS:-800} OUT=${OUT:-runs/v3} RESULT=${RESULT:-research/results/probe_v3_drafters}
REGEN=${REGEN:-$OUT/regen}  # another run's regenerated text can be reused
mkdir -p "$OUT" results
[ -f data/corpus/train.txt ] || $H corpus --out data/corpus

$H regenerate --target "$TARGET" --prompts-from data/corpus --out "$REGEN" --tokens 250000 --batch 64 \
  --greedy-share 0.5 --temperature 1.0 --prompt-len 64..384 --seq-len 512 --threads 2

train() {  # name, memory
  $H train-drafter --target "$TARGET" --data "$REGEN" --out "$OUT/drafter-$1" --memory "$2" --window 128 \
    --intermediate-size 512 --markov-rank 32 --steps "$STEPS" --batch 4 --threads 1 > "$OUT/drafter-$1.log" 2>&1
}
train hyflash mamba2 & train swa off & wait

exports=()
for name in hyflash swa; do
  [ -f "$OUT/export-$name/manifest.json" ] ||
    $H export --target "$TARGET" --drafter "$OUT/drafter-$name/model" --out "$OUT/export-$name" --format onnx --force
  exports+=("$OUT/export-$name")
done
# with the history-limited ablation (HyFlash's memory cut to the last 256 features, on the eager backend)
$H probe "${exports[@]}" --distances 256,768,1536 --prompts 8 --threads 2 --memory-history 256 \
  --out "$RESULT.json" --plot "$RESULT.png"
