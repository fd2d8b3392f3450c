"""Why a drafter's first slot fails on chat: its accuracy against the target's confidence, how often the target's
token is among its first few guesses, and what a two-branch draft of the same 8 verify rows would commit.

On the target's greedy answers to the held-out chat set (`runs/heldout-answers`, written as in
`walk_heldout_chat.py`'s docstring), at every position a round may be anchored: the target's probability of its own
next token (from its logits over the row), the drafter's slot-1 guesses (top 4), and the accepted length of three
drafts that a verify of 8 rows can check: the chain of 7 (what the loop drafts), and two branches that share the
anchor, the top-1 chain cut to 4 and a second chain of 3 from slot 1's second guess (its later slots the drafter's
argmax after that guess, through the Markov head; the slot states do not depend on the chain). Each answer is then
walked round by round (`walk`) on each kind's lengths.

    .venv/bin/python research/scripts/slot_one.py --answers runs/heldout-answers --drafter smollm2-135m-instruct \\
        --out research/smollm2-drafter/results/slot_one_shipped.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from hyflash.models.loading import load_drafter, load_target, resolve, weights_sha256
from hyflash.runtime_py.chatbench import read_chats
from hyflash.train.cached import ConversationRows
from hyflash.train.drafter import ANCHORS_AT_ONCE, Distill, walk

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)


def chain(drafter, states, first, copy):
    """(A,) slot-1 tokens, (A, 7, d) states -> (A, 7) target ids: slot 1 given, each later slot the argmax of its
    logits with the Markov bias from the slot before (as draft_read unrolls it)."""
    out = [first]
    for k in range(1, states.shape[1]):
        c = (copy[0][:, k], copy[1][:, k]) if copy is not None else None
        logits = drafter.head(states[:, k], out[-1], c)
        out.append(drafter.target_ids(logits.argmax(-1)))
    return torch.stack(out, 1)


def accepted(guess, labels):
    return (guess == labels).long().cumprod(-1).sum(-1)


@torch.no_grad()
def measure(target, drafter, rows):
    """Per row: confidence (T,), slot-1 rank hits, and lengths (T,) for 'chain7', 'tree4+3'."""
    model = Distill(drafter, target, ANCHORS_AT_ONCE)
    block = drafter.cfg.block
    per_row = []
    for r in range(len(rows)):
        one = rows[r:r + 1]
        tokens = torch.from_numpy(one.tokens)
        hidden, _ = target.trunk(tokens)
        probs = torch.softmax(target.lm_head(hidden[0]).float(), -1)  # (T, V): the target's next-token distribution
        conf = probs.max(-1).values.numpy()
        t = one.tokens.shape[1]
        lengths = {"chain7": np.zeros(t, np.int64), "tree4+3": np.zeros(t, np.int64)}
        rank = np.full(t, -1, np.int64)  # the label's place among slot 1's top 4 (4: not there)
        allowed = np.flatnonzero(one.anchorable[0, 1:t - block]) + 1
        for start in range(0, len(allowed), ANCHORS_AT_ONCE):
            mask = np.zeros_like(one.anchorable)
            mask[0, allowed[start:start + ANCHORS_AT_ONCE]] = True
            for a, labels, states, prev, _, copy in model.predict(tokens, torch.from_numpy(mask),
                                                                  torch.from_numpy(one.features),
                                                                  torch.from_numpy(one.labels)):
                c1 = (copy[0][:, 0], copy[1][:, 0]) if copy is not None else None
                top = drafter.target_ids(drafter.head(states[:, 0], prev[:, 0], c1).topk(4, -1).indices)  # (A, 4)
                hit = top == labels[:, :1]
                rank[a.numpy()] = torch.where(hit.any(-1), hit.float().argmax(-1), 4).numpy()
                first = chain(drafter, states, top[:, 0], copy)
                second = chain(drafter, states, top[:, 1], copy)
                lengths["chain7"][a.numpy()] = 1 + accepted(first, labels).numpy()
                branch = torch.maximum(accepted(first[:, :4], labels[:, :4]), accepted(second[:, :3], labels[:, :3]))
                lengths["tree4+3"][a.numpy()] = 1 + branch.numpy()
        per_row.append((conf, rank, lengths))
    return per_row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=Path, required=True, help="`hyflash regenerate` of the held-out chat set")
    ap.add_argument("--chat", type=Path, default=Path("data/chat/heldout.jsonl"))
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve(args.target, "target")
    if not (args.answers / "config.json").is_file():
        raise SystemExit(f"{args.answers}: not a regenerated chat folder; write one as walk_heldout_chat.py's "
                         "docstring says")
    target = load_target(target_dir).eval()
    drafter = load_drafter(resolve(args.drafter, "drafter"), target).eval()
    rows = ConversationRows(args.answers, True, weights_sha256(target_dir))
    categories = [chat["category"] for chat in read_chats(args.chat)]
    ids = [i for i in range(len(rows.tokens)) if rows.greedy[i]]
    per_row = measure(target, drafter, rows.rows(ids))

    conf = np.concatenate([c[r >= 0] for c, r, _ in per_row])
    rank = np.concatenate([r[r >= 0] for _, r, _ in per_row])
    bins = []
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (conf >= lo) & (conf < hi)
        bins.append({"target_p_max": [lo, min(hi, 1.0)], "share": float(m.mean()),
                     "slot1_top1": float((rank[m] == 0).mean()) if m.any() else None,
                     "slot1_top2": float((rank[m] <= 1).mean()) if m.any() else None})
    walked = {}
    for kind in ("chain7", "tree4+3"):
        by_cat = defaultdict(list)
        for (_, _, lengths), i in zip(per_row, ids):
            by_cat[categories[i]] += walk(lengths[kind])
        pooled = [n for v in by_cat.values() for n in v]
        walked[kind] = {"walked_tau": float(np.mean(pooled)), "rounds": len(pooled),
                        "by_category": {c: float(np.mean(v)) for c, v in sorted(by_cat.items())}}
    report = {"answers": str(args.answers), "drafter": args.drafter, "greedy_conversations": len(ids),
              "anchors": int(len(rank)), "slot1_top_k": {f"top{k}": float((rank < k).mean()) for k in (1, 2, 4)},
              "target_p_max_mean": float(conf.mean()), "by_target_confidence": bins, "walked": walked}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
