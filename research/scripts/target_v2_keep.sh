#!/usr/bin/env bash
# Keep the second-generation target's training progress in the repository at the end of a session:
# its latest checkpoint's weights in bf16 (21 MB; the fp32 weights and the 84 MB of Adam moments stay
# under runs/), the step and the log (state.json), and the log as JSON lines beside the model card.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=runs/target-v2/checkpoint dest=checkpoints/target-v2
mkdir -p "$dest" research/reference/target-v2
.venv/bin/python - "$src" "$dest" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
src, dest = sys.argv[1:]
save_file({k: v.to(torch.bfloat16) for k, v in load_file(f"{src}/model.safetensors").items()}, f"{dest}/model.safetensors")
PY
cp "$src/state.json" "$dest/state.json"
cp runs/target-v2/log.jsonl research/reference/target-v2/train_log.jsonl
echo "kept step $(.venv/bin/python -c "import json; print(json.load(open('$dest/state.json'))['step'])") in $dest"
