#!/usr/bin/env bash
# After `hyflash train-target` finishes: install the target as the embedded reference and make the
# figures its model card quotes (loss curve, loss by position, held-out accuracy).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=hyflash/reference/target  # what the package carries: config, weights, tokenizer
card=research/reference/target        # what the model card quotes: log, curves, held-out figures
mkdir -p "$dest" "$card"
cp runs/target/model/config.json runs/target/model/model.safetensors runs/target/model/tokenizer.json "$dest/"
cp runs/target/log.jsonl "$card/train_log.jsonl"
.venv/bin/python -c "
from pathlib import Path; import json
from hyflash.train.evaluate import plot_training_log
print(json.dumps(plot_training_log(Path('runs/target/log.jsonl'), Path('$card/loss_curve.png'), 'reference target')))
" > "$card/train_summary.json"
.venv/bin/hyflash eval-target --target reference --windows 119 --plot "$card/loss_by_position.png" --json \
  > "$card/heldout.json"
cat "$card/train_summary.json" "$card/heldout.json"
