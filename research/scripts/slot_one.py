"""Why a drafter's first slot fails on chat: its accuracy against the target's confidence, how often the target's
token is among its first few guesses, and what a two-branch draft of the same 8 verify rows would commit.

On the target's greedy answers to the held-out chat set (`runs/heldout-answers`, written as in
`walk_heldout_chat.py`'s docstring), at every position a round may be anchored: the target's probability of its own
next token (from its logits over the row), the drafter's slot-1 guesses (top 4), whether the target's token is in
the drafter's vocabulary at all, and the accepted length of three
drafts that a verify of 8 rows can check: the chain of 7 (what the loop drafts), and two branches that share the
anchor, the top-1 chain cut to 4 and a second chain of 3 from slot 1's second guess (its later slots the drafter's
argmax after that guess, through the Markov head; the slot states do not depend on the chain). A third, a bound:
the chain of 7 with prompt-lookup's token taken wherever the target's token is outside the draft vocabulary and is
lookup's (what a copy that reached beyond the vocabulary could add at most). Each answer is then walked round by
round (`walk`) on each kind's lengths. Last, slot 1 with its anchor taken away (`anchor_ablation`): how much of
what it gets right comes from the token it follows.

    .venv/bin/python research/scripts/slot_one.py --answers runs/heldout-answers --drafter smollm2-135m-instruct \\
        --out research/smollm2-drafter/results/slot_one_shipped.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from walk_heldout_chat import greedy_answers, walk_by_category  # this folder's: run from the repository root

from hyflash.models.loading import load_drafter, load_target, resolve
from hyflash.train.drafter import ANCHORS_AT_ONCE, Distill

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)
KINDS = ("chain7", "tree4+3", "chain7, copies beyond the vocabulary")


def chain(drafter, states, first, copy):
    """(A,) slot-1 tokens, (A, 7, d) states -> (A, 7) target ids: slot 1 given, each later slot the argmax of its
    logits with the Markov bias from the slot before (as draft_read unrolls it)."""
    out = [first]
    for k in range(1, states.shape[1]):
        c = (copy[0][:, k], copy[1][:, k]) if copy is not None else None
        logits = drafter.head(states[:, k], out[-1], c)
        out.append(drafter.target_ids(logits.argmax(-1)))
    return torch.stack(out, 1)


def anchored(model, rows):
    """(row index, anchors (A,), labels (A, 7), states (A, 7, d), prev (A, 7), copy) at every position of every row
    where a round may be anchored, `ANCHORS_AT_ONCE` at a time (`Distill.predict` on the rows' feature cache)."""
    block = model.drafter.cfg.block
    for r in range(len(rows)):
        one = rows[r:r + 1]
        t = one.tokens.shape[1]
        allowed = np.flatnonzero(one.anchorable[0, 1:t - block]) + 1
        for start in range(0, len(allowed), ANCHORS_AT_ONCE):
            mask = np.zeros_like(one.anchorable)
            mask[0, allowed[start:start + ANCHORS_AT_ONCE]] = True
            for a, labels, states, prev, _, copy in model.predict(
                    torch.from_numpy(one.tokens), torch.from_numpy(mask), torch.from_numpy(one.features),
                    torch.from_numpy(one.labels)):
                yield r, a.numpy(), labels, states, prev, copy


def accepted(guess, labels):
    return (guess == labels).long().cumprod(-1).sum(-1)


@torch.no_grad()
def measure(target, drafter, rows):
    """Per row: the target's confidence in its next token (T,), the label's rank among slot 1's top 4 (T,; -1 where
    no anchor), lengths (T,) for each of `KINDS`, outside (T,) and slot 1's first guess (T,)."""
    model = Distill(drafter, target, ANCHORS_AT_ONCE)
    per_row = []
    for r in range(len(rows)):
        hidden, _ = target.trunk(torch.from_numpy(rows.tokens[r:r + 1]))
        probs = torch.softmax(target.lm_head(hidden[0]).float(), -1)  # (T, V): the target's next-token distribution
        t = rows.tokens.shape[1]
        per_row.append((probs.max(-1).values.numpy(), np.full(t, -1, np.int64),  # rank among slot 1's top 4 (4: none)
                        {kind: np.zeros(t, np.int64) for kind in KINDS},
                        np.zeros(t, bool), np.zeros(t, np.int64)))  # outside the draft vocabulary; slot 1's guess
    for r, a, labels, states, prev, copy in anchored(model, rows):
        _, rank, lengths, outside, guess = per_row[r]
        c1 = (copy[0][:, 0], copy[1][:, 0]) if copy is not None else None
        top = drafter.target_ids(drafter.head(states[:, 0], prev[:, 0], c1).topk(4, -1).indices)  # (A, 4)
        hit = top == labels[:, :1]
        rank[a] = torch.where(hit.any(-1), hit.float().argmax(-1), 4).numpy()
        outside[a] = (drafter.head_index(labels[:, 0]) < 0).numpy()
        guess[a] = top[:, 0].numpy()
        first = chain(drafter, states, top[:, 0], copy)
        second = chain(drafter, states, top[:, 1], copy)
        lengths["chain7"][a] = 1 + accepted(first, labels).numpy()
        branch = torch.maximum(accepted(first[:, :4], labels[:, :4]), accepted(second[:, :3], labels[:, :3]))
        lengths["tree4+3"][a] = 1 + branch.numpy()
        if copy is not None:  # lookup's token where the target's is outside the draft vocabulary: a bound
            reach = (drafter.head_index(labels) < 0) & (copy[0] == labels)
            lengths["chain7, copies beyond the vocabulary"][a] = 1 + accepted(torch.where(reach, labels, first),
                                                                              labels).numpy()
    return per_row


ABLATED = 0  # the token an ablated anchor becomes: a constant that says nothing of the real one


@torch.no_grad()
def anchor_ablation(target, drafter, rows) -> dict:
    """Slot 1's first guess right with the anchor taken away: its embedding (slot 0's input) replaced by token
    `ABLATED`, then the Markov head's previous token too."""
    model = Distill(drafter, target, ANCHORS_AT_ONCE)
    real = drafter.slot_inputs
    drafter.slot_inputs = lambda tokens, lookup=None: real(torch.full_like(tokens, ABLATED), lookup)
    hits = {"anchor embedding ablated": [], "anchor embedding and Markov input ablated": []}
    try:
        for _, _, labels, states, prev, copy in anchored(model, rows):
            c1 = (copy[0][:, 0], copy[1][:, 0]) if copy is not None else None
            for name, p in zip(hits, (prev[:, 0], torch.full_like(prev[:, 0], ABLATED))):
                guess = drafter.target_ids(drafter.head(states[:, 0], p, c1).argmax(-1))
                hits[name] += (guess == labels[:, 0]).tolist()
    finally:
        drafter.slot_inputs = real
    return {name: float(np.mean(v)) for name, v in hits.items()}


def tokenizer_of(target_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(target_dir / "tokenizer.json"))


def print_examples(per_row, rows, tokenizer, count: int) -> None:
    """Up to `count` confident misses, spread over the rows: the text up to the anchor, the target's token, its
    probability and slot 1's first guess."""
    misses = [(r, p) for r, (conf, rank, _, _, _) in enumerate(per_row)
              for p in np.flatnonzero((rank > 0) & (conf >= 0.9))]
    for r, p in misses[::max(1, len(misses) // count)][:count]:
        conf, _, _, _, guess = per_row[r]
        text = tokenizer.decode(rows.tokens[r][max(0, p - 12):p + 1].tolist())
        print(f"{text[-60:]!r} -> {tokenizer.decode([int(rows.labels[r][p])])!r} ({conf[p]:.2f}), "
              f"drafted {tokenizer.decode([int(guess[p])])!r}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = report["by_target_confidence"]
    names = [f"{b['target_p_max'][0]:.1f}-{b['target_p_max'][1]:.1f}" for b in bins]
    x = np.arange(len(bins))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.2, [b["slot1_top1"] for b in bins], 0.4, label="slot 1's first guess right")
    ax.bar(x + 0.2, [b["slot1_top2"] for b in bins], 0.4, label="one of its first two")
    ax.plot(x, [b["share"] for b in bins], "ko-", label="share of positions")
    ax.set_xticks(x, names)
    ax.set_xlabel("the target's probability of its own next token")
    ax.set_ylim(0, 1)
    ax.set_title(f"{report['drafter']} on the target's answers to held-out chat ({report['anchors']:,} positions)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=Path, required=True, help="`hyflash regenerate` of the held-out chat set")
    ap.add_argument("--chat", type=Path, default=Path("data/chat/heldout.jsonl"))
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--examples", type=int, default=0,
                    help="print N positions where the target gives its token 0.9 or more and slot 1 misses it")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="a PNG of slot 1's accuracy by the target's confidence")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve(args.target, "target")
    target = load_target(target_dir).eval()
    drafter = load_drafter(resolve(args.drafter, "drafter"), target).eval()
    ids, categories, rows = greedy_answers(args.answers, args.chat, target_dir)
    per_row = measure(target, drafter, rows)

    conf = np.concatenate([row[0][row[1] >= 0] for row in per_row])
    rank = np.concatenate([row[1][row[1] >= 0] for row in per_row])
    outside = np.concatenate([row[3][row[1] >= 0] for row in per_row])
    if args.examples:
        print_examples(per_row, rows, tokenizer_of(target_dir), args.examples)
    bins = []
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (conf >= lo) & (conf < hi)
        bins.append({"target_p_max": [lo, min(hi, 1.0)], "share": float(m.mean()),
                     "slot1_top1": float((rank[m] == 0).mean()) if m.any() else None,
                     "label_outside_draft_vocab": float(outside[m].mean()) if m.any() else None,
                     "slot1_top2": float((rank[m] <= 1).mean()) if m.any() else None})
    walked = {}
    for kind in KINDS:
        by_cat = walk_by_category([row[2][kind] for row in per_row], categories)
        pooled = [n for v in by_cat.values() for n in v]
        walked[kind] = {"walked_tau": float(np.mean(pooled)), "rounds": len(pooled),
                        "by_category": {c: float(np.mean(v)) for c, v in sorted(by_cat.items())}}
    report = {"answers": str(args.answers), "drafter": args.drafter, "greedy_conversations": len(ids),
              "anchors": int(len(rank)), "slot1_top_k": {f"top{k}": float((rank < k).mean()) for k in (1, 2, 4)},
              "slot1_label_outside_draft_vocab": float(outside.mean()),
              "target_p_max_mean": float(conf.mean()), "by_target_confidence": bins,
              "slot1_top1_without_the_anchor": {"as it is": float((rank == 0).mean()),
                                                **anchor_ablation(target, drafter, rows)},
              "walked": walked}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
