"""A trained drafter with layers added on top that start as the identity: does capacity move held-out τ?

Each new layer (attention over the window, its memory, MLP) is fresh except the three projections that write
into the residual stream (attention's o, the memory's out_proj, the MLP's down), which start at zero: the grown
drafter drafts exactly as the one it grew from until trained (checked on a real row before writing). Continue it
with `train-drafter --init-from` (train_drafters.sh with INIT_FROM).

    .venv/bin/python research/smollm2-drafter/grow_drafter.py --add-layers 1 --out runs/grow-init-3
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from common_trunk import start_logits  # this folder's: run as a script from the repository root

from hyflash.models.drafter import Drafter
from hyflash.models.loading import load_drafter, load_target, resolve, save_drafter, target_info

ZERO_AT_START = ("o.weight", "mem.out_proj.weight", "down.weight")  # what a layer adds to the residual stream


def grow(old: Drafter, target, add: int, seed: int) -> Drafter:
    cfg = dataclasses.replace(old.cfg, layers=old.cfg.layers + add)
    torch.manual_seed(seed)
    new = Drafter.for_target(target, cfg)
    state, kept = new.state_dict(), old.state_dict()
    for name, value in state.items():
        if name in kept:
            value.copy_(kept[name])
        elif name.startswith("layers.") and name.split(".", 2)[2] in ZERO_AT_START:
            value.zero_()
    new.load_state_dict(state)
    return new.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--add-layers", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    target = load_target(resolve(args.target, "target"))
    old = load_drafter(resolve(args.drafter, "drafter"), target)
    new = grow(old, target, args.add_layers, args.seed)

    gap = float((start_logits(old, target) - start_logits(new, target)).abs().max())
    if gap > 1e-4:
        raise SystemExit(f"grow_drafter: the grown drafter does not start as the old one (max |logit gap| {gap})")
    save_drafter(new, args.out, target_info(target), dtype=torch.float32)
    params = sum(p.numel() for p in new.parameters())
    print(f"{args.out}: {new.cfg.layers} layers, {params / 1e6:.2f} M parameters "
          f"({params * 2 / 2**20:.1f} MiB in bf16); start logit gap {gap:.2e}")


if __name__ == "__main__":
    main()
