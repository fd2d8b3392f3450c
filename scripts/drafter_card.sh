#!/usr/bin/env bash
# After the drafter runs of scripts/reference.sh: install each drafter as embedded reference data
# (config + bf16 weights in the package; its training log and loss curve beside the model card), export each with the reference target,
# and measure held-out acceptance by context bucket with `hyflash bench` (the model card's table).
# Usage: scripts/drafter_card.sh [NAMES...]   (default: hyflash swa full gdn)
#        INSTALL=0 scripts/drafter_card.sh     (re-measure the embedded drafters: no install from runs/)
set -euo pipefail
cd "$(dirname "$0")/.."
H=.venv/bin/hyflash
names=("$@")
[ $# -gt 0 ] || names=(hyflash swa full gdn)
exports=()
for name in "${names[@]}"; do
  if [ "${INSTALL:-1}" != 0 ]; then
    dest=hyflash/reference/drafter-$name card=docs/reference/drafter-$name
    mkdir -p "$dest" "$card"
    cp "runs/drafter-$name/model/config.json" "runs/drafter-$name/model/model.safetensors" "$dest/"
    cp "runs/drafter-$name/log.jsonl" "$card/train_log.jsonl"
    .venv/bin/python -c "
from pathlib import Path; import json
from hyflash.train.evaluate import plot_training_log
print(json.dumps(plot_training_log(Path('runs/drafter-$name/log.jsonl'), Path('$card/loss_curve.png'), 'drafter $name')))
" > "$card/train_summary.json"
  fi
  ref=reference$([ "$name" = hyflash ] || echo "-$name")
  [ -f "runs/exports/v2-$name/manifest.json" ] ||
    $H export --target reference --drafter "$ref" --out "runs/exports/v2-$name" --format onnx --force
  exports+=("runs/exports/v2-$name")
done
# the int4 HyFlash drafter (ONNX MatMulNBits) beside the fp32 ones: how much tau quantization costs
[ -f runs/exports/v2-hyflash-int4/manifest.json ] ||
  $H export --target reference --drafter reference --out runs/exports/v2-hyflash-int4 --format onnx --quantize int4 --force
exports+=(runs/exports/v2-hyflash-int4)
$H bench "${exports[@]}" --buckets 256,512,1024,2048 --prompts-per-bucket "${PROMPTS:-8}" --max-new-tokens 64 \
  --threads 2 --plot docs/reference/bench.png --json > docs/reference/bench.json
.venv/bin/python -c "
import json; from hyflash.runtime_py.bench import format_results, markdown_tables
r = json.load(open('docs/reference/bench.json')); print(format_results(r)); print(); print(markdown_tables(r))"
