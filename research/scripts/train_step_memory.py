"""Peak memory of one drafter training step at Qwen3-0.6B's geometry (issue 16), random weights.

Builds the target (28 layers x 1,024, 16/8 heads of 128, MLP 3,072, vocabulary 151,936: 596 M
parameters) and a HyFlash drafter for it in this process, runs one forward and backward of
`Distill` on BATCH x SEQ random tokens, and prints the process's peak RSS as JSON. Run it once per
code version (a fresh process each time, so the peak is this step's):

    python research/scripts/train_step_memory.py                       # this checkout
    git worktree add /tmp/before <commit>; cd /tmp/before && PYTHONPATH=/tmp/before/.. python ...

It works with the drafter API before and after the sharing/chunking change (Distill.forward took
(tokens, first_anchor) before, (tokens, anchorable) after).
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import subprocess
import sys
import time

import torch

from hyflash.models.config import TargetConfig
from hyflash.models.drafter import Drafter, DrafterConfig
from hyflash.models.target import Target
from hyflash.train.drafter import Distill

QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
BATCH, SEQ, ANCHORS = 2, 512, 48


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    target = Target(TargetConfig.from_hf(QWEN3_06B)).eval().requires_grad_(False)
    drafter = Drafter.for_target(target, DrafterConfig.for_target(target, markov_rank=32))
    model = Distill(drafter, target, ANCHORS)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    tokens = torch.randint(0, 151936, (BATCH, SEQ))
    second = "anchorable" if "anchorable" in inspect.signature(Distill.forward).parameters else "first_anchor"
    extra = torch.ones(BATCH, SEQ, dtype=torch.bool) if second == "anchorable" else torch.ones(BATCH, dtype=torch.long)
    t = time.time()
    loss, _ = model(tokens, extra)
    loss.backward()
    code = os.path.dirname(os.path.realpath(inspect.getfile(Distill)))  # the checkout this code came from
    commit = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"commit": commit, "geometry": "qwen3-0.6b (random weights)",
                      "target_params": sum(p.numel() for p in target.parameters()),
                      "batch": BATCH, "seq_len": SEQ, "anchors": ANCHORS,
                      "rss_gib_after_building_models": round(before, 2),
                      "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                      "step_s": round(time.time() - t, 1), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
