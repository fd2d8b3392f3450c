"""A drafter's held-out acceptance on chat data, split by how the target answered (greedy or sampled): the mean
of 1 + right drafts over every anchor, and the rows walked as the loop rounds (`hyflash.train.drafter.walk`).
`eval-drafter` walks only the greedy rows; this shows both kinds side by side, on the same held-out rows, and
with `--first N` also each answer's first N tokens alone (what a bench capped at N new tokens walks).

    .venv/bin/python research/scripts/walked_by_kind.py --drafter smollm2-135m-instruct \\
        --data data/chat/smollm2-regen-prose --rows 16 --out research/smollm2-drafter/results/walked_by_kind.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from hyflash.cli.args import positive
from hyflash.models.loading import load_drafter, load_target, resolve, weights_sha256
from hyflash.train.batches import open_rows
from hyflash.train.drafter import Distill, acceptance_lengths, walk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--data", type=Path, required=True, help="a conversations folder with its feature cache")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--first", type=positive(), default=None, help="also walk each answer's first N tokens alone")
    ap.add_argument("--no-feature-cache", action="store_true", help="run the target instead of reading its cache")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve(args.target, "target")
    target = load_target(target_dir)
    drafter = load_drafter(resolve(args.drafter, "drafter"), target).eval()
    rows = open_rows(args.data, target_dir, None, None, weights_sha256(target_dir),
                     features=not args.no_feature_cache).heldout(args.rows)
    lengths = acceptance_lengths(Distill(drafter, target, 48), rows)
    report = {"drafter": args.drafter, "data": str(args.data), "rows": args.rows, "first": args.first}
    for kind, pick in (("greedy", rows.greedy), ("sampled", ~rows.greedy)):
        mine = [length for length, keep in zip(lengths, pick) if keep]
        every = np.concatenate([length[length > 0] for length in mine])
        rounds = [n for length in mine for n in walk(length)]
        report[kind] = {"rows": len(mine), "anchors": len(every), "tau_every_anchor": float(every.mean()),
                        "walked_tau": sum(rounds) / len(rounds), "walked_rounds": len(rounds)}
        print(f"{kind}: {len(mine)} rows, tau over every anchor {every.mean():.3f}, walked {report[kind]['walked_tau']:.3f} "
              f"({len(rounds)} rounds)")
        if args.first:
            head = [n for length in mine for n in walk(length, args.first)]
            report[kind].update(first_walked_tau=sum(head) / len(head), first_walked_rounds=len(head))
            print(f"  each answer's first {args.first} tokens walked: {report[kind]['first_walked_tau']:.3f} "
                  f"({len(head)} rounds)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
