"""Three drafters that start as one: the shipped drafter's trunk with a fresh memory of each kind.

The equal-steps comparison from scratch (HyFlash, the window drafter of equal size, Gated DeltaNet) needs
far more steps than two CPU cores give before any of them drafts well. This builds the start of a cheaper
one at the shipped drafter's level: every weight the three share (fusion, attention, MLP, heads, the lookup
input) is the shipped drafter's, and what each adds starts at zero effect, so the three draft identically
at step 0 and differ only in what their own part learns:

- hyflash: a fresh Mamba-2 memory, its out_proj zero;
- gdn:     a fresh Gated DeltaNet memory, its out_proj zero;
- swa:     no memory; the MLP widened to the intermediate size that makes its parameter count HyFlash's
           (2,160), the new units' down-projection columns zero.

Each is written as a drafter folder that `train-drafter --init-from` continues (train_drafters.sh with
INIT_FROM); the script checks that the three give the same draft logits on a real row before writing.

    .venv/bin/python research/smollm2-drafter/common_trunk.py --out runs/trunk-init
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from hyflash.models.drafter import Drafter
from hyflash.models.loading import load_drafter, load_target, resolve, save_drafter, target_info
from hyflash.models.lookup import lookup_many

KINDS = {"hyflash": ("mamba2", None), "gdn": ("gated_deltanet", None), "swa": ("off", 2160)}


def build(shipped: Drafter, target, memory: str, intermediate: int | None, seed: int) -> Drafter:
    cfg = dataclasses.replace(shipped.cfg, memory=memory,
                              intermediate_size=intermediate or shipped.cfg.intermediate_size)
    torch.manual_seed(seed)
    new = Drafter.for_target(target, cfg)
    old = shipped.state_dict()
    state = new.state_dict()
    inter = shipped.cfg.intermediate_size
    for name, value in state.items():
        if ".mem." in name:
            if name.endswith("mem.out_proj.weight"):
                value.zero_()  # the fresh memory reads nothing into the slots until trained
            continue  # the rest of the memory: fresh
        if name.endswith("gate_up.weight") and value.shape != old[name].shape:
            gate, up = value.chunk(2, dim=0)  # views: rows [gate; up]
            old_gate, old_up = old[name].chunk(2, dim=0)
            gate[:inter], up[:inter] = old_gate, old_up  # the new units' rows stay fresh
            continue
        if name.endswith("down.weight") and value.shape != old[name].shape:
            value.zero_()
            value[:, :inter] = old[name]  # the new units' columns zero: they add nothing until trained
            continue
        value.copy_(old[name])
    new.load_state_dict(state)
    return new.eval()


@torch.no_grad()
def start_logits(drafter: Drafter, target) -> torch.Tensor:
    """The drafter's logits at four anchors of one fixed chat-like row, from the target's own features: what the
    start checks compare (two drafters that agree here to float precision draft alike)."""
    tokens = torch.tensor([1, 9690, 198, 2683, 339, 253, 1345, 3149, 282, 260, 5029, 30, 2, 198, 1] * 12)
    _, features = target.trunk(tokens[None])
    anchors = torch.tensor([20, 60, 130, 160])
    prev = tokens[anchors[:, None] + torch.arange(drafter.cfg.block)]
    lookup = (tuple(torch.from_numpy(x) for x in lookup_many(tokens.numpy(), anchors.numpy(), drafter.cfg.block))
              if drafter.cfg.lookup_input else None)
    return drafter.forward_train(features[0], tokens, anchors, prev, lookup=lookup)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT-hyflash, OUT-gdn, OUT-swa")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    target = load_target(resolve(args.target, "target"))
    shipped = load_drafter(resolve(args.drafter, "drafter"), target)
    if shipped.cfg.memory != "mamba2":
        raise SystemExit(f"common_trunk: {args.drafter} has memory {shipped.cfg.memory!r}; pass a HyFlash drafter")
    built = {name: build(shipped, target, memory, inter, args.seed) for name, (memory, inter) in KINDS.items()}

    logits = {name: start_logits(d, target) for name, d in {**built, "shipped": shipped}.items()}
    gaps = {name: float((x - logits["swa"]).abs().max()) for name, x in logits.items()}
    if max(v for k, v in gaps.items() if k != "shipped") > 1e-4:
        raise SystemExit(f"common_trunk: the three do not start alike (max |logit gap| {gaps})")
    for name, d in built.items():
        folder = Path(f"{args.out}-{name}")
        save_drafter(d, folder, target_info(target), dtype=torch.float32)
        params = sum(p.numel() for p in d.parameters())
        print(f"{folder}: {d.cfg.memory}, MLP {d.cfg.intermediate_size}, {params / 1e6:.2f} M parameters")
    print(json.dumps({"start_logit_gap_vs_swa (shipped: its trained memory, for scale)": gaps}))


if __name__ == "__main__":
    main()
