"""Drafters walked on the target's own greedy answers to the held-out chat set, by category: a cheap stand-in for
`hyflash bench --chat`'s τ at the full block when several drafters are to be compared.

The answers come from one `hyflash regenerate` of the held-out set (every turn greedy, 128 new tokens at most,
features in the same pass), so every drafter reads the same rows; each answer is walked round by round on the
teacher-forced acceptance lengths (`hyflash.train.drafter.walk`): on greedy rows that is what the loop commits
(the bench's τ; the last block of a conversation's last answer is not walked, alike for every drafter). Per
category the JSON also counts the rounds by the tokens they commit (`rounds_committing[k-1]`: k tokens; k = 1, no
draft accepted). Any regenerated chat folder works the same with `--chat` the prompts it answered: `--limit N` its
first N conversations, `--first 128` each answer's first 128 tokens alone (training folders' answers run to 320).

    .venv/bin/hyflash regenerate --target smollm2-135m-instruct --prompts-from data/chat/heldout.jsonl \\
        --out runs/heldout-answers --tokens 1000000 --batch 64 --max-new-tokens 128 --greedy-share 1.0
    .venv/bin/python research/scripts/walk_heldout_chat.py --answers runs/heldout-answers \\
        shipped=smollm2-135m-instruct window=runs/trunk-swa/model --out walked.json
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
from hyflash.train.drafter import Distill, acceptance_lengths, walk


def greedy_answers(answers: Path, chat: Path, target_dir: Path, limit: int | None = None):
    """A regenerated chat folder's greedily answered conversations (the first `limit`): their ids, categories (from
    the chat .jsonl it was regenerated from) and rows with the feature cache. The walk is the greedy loop's rounds
    on greedy rows alone."""
    if not (answers / "config.json").is_file():
        raise SystemExit(f"{answers}: not a regenerated chat folder; write one with `hyflash regenerate "
                         "--prompts-from data/chat/heldout.jsonl --greedy-share 1.0 ...` (walk_heldout_chat.py's "
                         "docstring)")
    rows = ConversationRows(answers, True, weights_sha256(target_dir))
    categories = [c["category"] for c in read_chats(chat)]
    if len(categories) < len(rows.tokens):  # a folder's conversations are its prompts' first ones, in order
        raise SystemExit(f"{answers}: {len(rows.tokens)} conversations, {chat} {len(categories)}; "
                         "pass the chat file the answers were regenerated from")
    ids = [i for i in range(min(len(rows.tokens), limit or len(rows.tokens))) if rows.greedy[i]]
    return ids, [categories[i] for i in ids], rows.rows(ids)


def walk_by_category(lengths, categories, first: int | None = None) -> dict[str, list[int]]:
    """Each row's acceptance lengths walked round by round (`walk`), the rounds gathered by the row's category."""
    by_cat = defaultdict(list)
    for length, category in zip(lengths, categories):
        by_cat[category] += walk(length, first)
    return by_cat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafters", nargs="+", help="NAME=FOLDER (or a reference name)")
    ap.add_argument("--answers", type=Path, required=True, help="`hyflash regenerate` of the held-out chat set")
    ap.add_argument("--chat", type=Path, default=Path("data/chat/heldout.jsonl"),
                    help="the chat .jsonl the answers were regenerated from (each row's category)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=None, help="the first N conversations")
    ap.add_argument("--first", type=int, default=None, help="walk each answer's first N tokens alone")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve(args.target, "target")
    target = load_target(target_dir)
    ids, categories, all_rows = greedy_answers(args.answers, args.chat, target_dir, args.limit)
    report = {"answers": str(args.answers), "greedy_conversations": len(ids), "first": args.first, "drafters": {}}
    for spec in args.drafters:
        name, _, folder = spec.partition("=")
        drafter = load_drafter(resolve(folder or name, "drafter"), target)
        lengths = acceptance_lengths(Distill(drafter, target, 48), all_rows)
        by_cat = walk_by_category(lengths, categories, args.first)
        pooled = [n for v in by_cat.values() for n in v]
        entry = {"folder": folder or name, "walked_tau": sum(pooled) / len(pooled), "rounds": len(pooled),
                 "by_category": {c: {"walked_tau": sum(v) / len(v), "rounds": len(v),
                                     "rounds_committing": np.bincount(v, minlength=drafter.cfg.block + 2)[1:].tolist()}
                                 for c, v in sorted(by_cat.items())}}
        report["drafters"][name] = entry
        cats = " ".join(f"{c} {e['walked_tau']:.2f}" for c, e in entry["by_category"].items())
        print(f"{name}: walked tau {entry['walked_tau']:.3f} ({len(pooled)} rounds); {cats}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
