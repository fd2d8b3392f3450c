#!/usr/bin/env bash
# Issue 14, item 4: does training on the target's own text help? The HyFlash drafter trained twice with
# the same recipe, steps and tokens (STEPS x 4 sequences x 512 tokens), once on windows of the corpus
# (labels: the target's choices after the corpus prefix) and once on regenerated text (the target's
# own continuations of training prompts, half greedy, half sampled at T = 1; anchors in the response),
# then both exported and measured side by side on held-out prompts (greedy, 8 per bucket), with
# prompt-lookup and hybrid (each drafter calibrated on regenerated training text) beside them.
# TARGET defaults to the embedded target; every step resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
H=.venv/bin/hyflash
TARGET=${TARGET:-reference} STEPS=${STEPS:-600} OUT=${OUT:-runs/ablation} RESULT=${RESULT:-research/results/ablation_regen.json}
mkdir -p "$OUT" results
[ -f data/corpus/train.txt ] || $H corpus --out data/corpus

# the target's own text: ~2,000 sequences of 512 tokens (prompts of 64-384 tokens from the train split)
$H regenerate --target "$TARGET" --prompts-from data/corpus --out "$OUT/regen" --tokens 250000 --batch 64 \
  --greedy-share 0.5 --temperature 1.0 --prompt-len 64..384 --seq-len 512 --threads 1

train() {  # name, data
  $H train-drafter --target "$TARGET" --data "$2" --out "$OUT/drafter-$1" --memory mamba2 --window 128 \
    --intermediate-size 512 --markov-rank 32 --steps "$STEPS" --batch 4 --threads 1
}
train corpus data/corpus
train regen "$OUT/regen"
exports=()
for name in corpus regen; do
  $H calibrate --drafter "$OUT/drafter-$name/model" --target "$TARGET" --data "$OUT/regen" \
    --plot "$OUT/drafter-$name/reliability.png" --json > "$OUT/drafter-$name/calibration.json"
  [ -f "$OUT/export-$name/manifest.json" ] ||
    $H export --target "$TARGET" --drafter "$OUT/drafter-$name/model" --out "$OUT/export-$name" --format onnx --force
  exports+=("$OUT/export-$name")
done
$H bench "${exports[@]}" --buckets 256,512,1024,2048 --prompts-per-bucket "${PROMPTS:-8}" --max-new-tokens 64 \
  --threads 1 --plot "${RESULT%.json}.png" --json > "$RESULT"
.venv/bin/python -c "
import json; from hyflash.runtime_py.bench import markdown_tables
print(markdown_tables(json.load(open('$RESULT'))))"
