"""A training checkpoint (runs/X/checkpoint) as a target folder `--init-from` reads: the reference
target's config and tokenizer, the checkpoint's weights in bf16 (as train-target writes its model).
Usage: python research/scripts/ckpt_to_target.py runs/X/checkpoint OUT"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from hyflash.models.loading import load_target, save_target

src, out = Path(sys.argv[1]), Path(sys.argv[2])
ref = Path(__file__).resolve().parents[2] / "hyflash" / "reference" / "target"
model = load_target(ref)
missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(src / "model.safetensors").items()},
                                            strict=False)
assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # the LM head is tied
save_target(model, out, json.loads((ref / "config.json").read_text()), dtype=torch.bfloat16)
(out / "tokenizer.json").write_bytes((ref / "tokenizer.json").read_bytes())
print(f"wrote {out} (step {json.loads((src / 'state.json').read_text())['step']})")
