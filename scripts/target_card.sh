#!/usr/bin/env bash
# After `hyflash train-target` finishes: install the target as the embedded reference and make the
# figures its model card quotes (loss curve, loss by position, held-out accuracy).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=hyflash/reference/target
mkdir -p "$dest"
cp runs/target/model/config.json runs/target/model/model.safetensors runs/target/model/tokenizer.json "$dest/"
cp runs/target/log.jsonl "$dest/train_log.jsonl"
.venv/bin/python -c "
from pathlib import Path; import json
from hyflash.train.evaluate import plot_training_log
print(json.dumps(plot_training_log(Path('runs/target/log.jsonl'), Path('$dest/loss_curve.png'), 'reference target')))
" > "$dest/train_summary.json"
.venv/bin/hyflash eval-target --target reference --windows 119 --plot "$dest/loss_by_position.png" --json \
  > "$dest/heldout.json"
cat "$dest/train_summary.json" "$dest/heldout.json"
