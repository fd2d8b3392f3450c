"""Why the drafter's live tau is below its teacher-forced tau: the same answers measured both ways.

For each held-out chat question (first turn), the export's runtime answers it with the drafter at the full
block (live: answer tokens / verify rounds, what `bench --chat` reports). On the very same token ids the eager
drafter is then run teacher-forced at every anchor of the answer (what `eval-drafter` and training's log
measure, but at every position instead of 48 drawn ones): a[p] = drafts its greedy chain gets right from
anchor p. Two averages of the same a[p]:

- teacher-forced tau: mean over all anchors of 1 + a[p];
- replayed tau: the rounds a live loop makes, anchor p -> p + a[p] + 1 from the answer's first token.

If the replay equals the live tau, the drafter sees at run time what it saw in training, and the gap to the
teacher-forced figure is which anchors the rounds land on (a long accepted chain skips the anchors after it,
which are likely ones too); if it does not, the runtime's inputs differ from training's. Also prints a[p]'s
distribution inside and outside stretches the answer repeats (a 16-token span seen earlier in the text).

    .venv/bin/python research/scripts/live_vs_forced.py runs/exports/smol-pte-fp32 --limit 64 --blind \
        --out research/smollm2-drafter/results/live_vs_forced.json

Since the replay gives the live rounds exactly, another drafter for the same target is measured on those answers
without an export (`--answers` that JSON, `--drafter` its folder): its replayed tau is the live tau it would get.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from hyflash.models.generation import load_tokenizer
from hyflash.models.loading import load_drafter
from hyflash.models.lookup import lookup_many
from hyflash.runtime_py.bench import open_exports
from hyflash.runtime_py.chat import Conversation
from hyflash.runtime_py.chatbench import read_chats
from hyflash.runtime_py.eager import load_models
from hyflash.runtime_py.loop import GenerationConfig, Stats

REPEAT_SPAN = 16


@torch.no_grad()
def accepted_at(target, drafter, ids: list[int], start: int, blind: bool = False) -> np.ndarray:
    """a[p] for every anchor p in start..len(ids)-1: leading slots whose greedy draft (chain fed the target's
    own choices, as at run time while it is right) equals the target's choice. blind: the drafter's context
    features zeroed (what it drafts from the anchor token and its own weights alone)."""
    block = drafter.cfg.block
    tokens = torch.tensor(ids)
    hidden, features = target.trunk(tokens[None])
    if blind:
        features = torch.zeros_like(features)
    choice = (hidden[0] @ target.lm_head.weight.T).argmax(-1)  # choice[t]: the target's token after t
    out = []
    for chunk in torch.arange(start, len(ids)).split(64):
        label_pos = (chunk[:, None] + torch.arange(block)).clamp(max=len(ids) - 1)
        labels = choice[label_pos]
        prev = torch.cat([tokens[chunk][:, None], labels[:, :-1]], dim=1)
        found = (tuple(torch.from_numpy(x) for x in lookup_many(tokens.numpy(), chunk.numpy(), block))
                 if drafter.cfg.lookup_input else None)  # what the loop's lookup finds there, as in training
        logits, _ = drafter.forward_train(features[0], tokens, chunk, prev, lookup=found)
        guess = drafter.target_ids(logits.argmax(-1))
        valid = label_pos < len(ids) - 1  # past the answer's end there is no choice to compare with
        out.append(((guess == labels) & valid).long().cumprod(-1).sum(-1))
    return torch.cat(out).numpy()


def replay(a: np.ndarray) -> tuple[int, int]:
    """(decode tokens, rounds) of a live loop over a[p], p = 0 the answer's first token (the prefill's): each
    round makes 1 + a[p] tokens and lands on the next anchor, until the answer's last token."""
    end = len(a) - 1
    p = rounds = 0
    while p < end:
        p += 1 + int(a[p])
        rounds += 1
    return min(p, end), rounds


def in_repeats(ids: list[int], start: int) -> np.ndarray:
    """For each position from start on: does the span of REPEAT_SPAN tokens ending there occur earlier?"""
    seen, out = set(), []
    for t in range(len(ids)):
        key = tuple(ids[max(0, t - REPEAT_SPAN + 1):t + 1])
        if t >= start:
            out.append(len(key) == REPEAT_SPAN and key in seen)
        seen.add(key)
    return np.array(out, bool)


def answers(args) -> list[dict]:
    """The held-out first turns answered by the export's runtime with its drafter (live rounds), or, with
    --answers, the ids of an earlier run's JSON (no runtime: the answers are the target's, whatever drafts)."""
    if args.answers:
        return [{k: r[k] for k in ("category", "ids", "start", "live_rounds")}
                for r in json.loads(Path(args.answers).read_text())["rows"]]
    (runtime,), _ = open_exports([args.export], args.backend, args.threads)
    tokenizer = load_tokenizer(runtime.folder)
    out = []
    for chat in read_chats(Path(args.chat), args.limit):
        conv = Conversation(runtime, tokenizer, GenerationConfig(max_new_tokens=args.new_tokens, draft="model"))
        stats = Stats()
        for _ in conv.turn(chat["turns"][0], stats):
            pass
        ids = conv.ids  # the answer's first token (the first round's anchor) is at len(ids) - len(stats.tokens)
        out.append({"category": chat["category"], "ids": ids, "start": len(ids) - len(stats.tokens),
                    "live_rounds": stats.rounds})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export", help="an export: its runtime answers, its target and (default) drafter are measured")
    ap.add_argument("--chat", default="data/chat/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--backend", default="executorch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", help="measure this drafter folder on the answers instead of the export's")
    ap.add_argument("--answers", help="the answers of an earlier run's JSON (live rounds are then that run's)")
    ap.add_argument("--blind", action="store_true", help="also teacher-forced with the context features zeroed")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    manifest = json.loads((Path(args.export) / "manifest.json").read_text())
    target, _ = load_models(args.export, manifest)
    drafter = load_drafter(drafter_dir(args), target).eval()
    rows = []
    for ans in answers(args):
        ids, start = ans["ids"], ans["start"]
        a = accepted_at(target, drafter, ids, start)
        tokens, rounds = replay(a)
        rep = in_repeats(ids, start)
        blind = accepted_at(target, drafter, ids, start, blind=True) if args.blind else None
        rows.append({**ans, "answer_tokens": len(ids) - start, "replay_tokens": tokens, "replay_rounds": rounds,
                     "forced_tau": float(1 + a.mean()), "replay_tau": tokens / rounds,
                     "live_tau": (len(ids) - start - 1) / max(ans["live_rounds"], 1),
                     "repeat_share": float(rep.mean()),
                     "forced_tau_in_repeats": float(1 + a[rep].mean()) if rep.any() else None,
                     "forced_tau_elsewhere": float(1 + a[~rep].mean()) if (~rep).any() else None,
                     "blind_tau": float(1 + blind.mean()) if blind is not None else None,
                     "accepted": a.tolist()})
        r = rows[-1]
        print(f"{r['category']:11s} live {r['live_tau']:.2f} replay {r['replay_tau']:.2f} "
              f"forced {r['forced_tau']:.2f} blind {r['blind_tau'] or 0:.2f} repeats {r['repeat_share']:.2f}",
              file=sys.stderr)
    every = np.concatenate([r["accepted"] for r in rows])
    pooled = {"live_tau": sum(r["answer_tokens"] - 1 for r in rows) / sum(r["live_rounds"] for r in rows),
              "replay_tau": sum(r["replay_tokens"] for r in rows) / sum(r["replay_rounds"] for r in rows),
              "forced_tau": float(1 + every.mean()),
              "blind_tau": (float(np.mean([r["blind_tau"] for r in rows for _ in r["accepted"]]))
                            if args.blind else None),
              "accepted_histogram": np.bincount(every, minlength=drafter.cfg.block + 1).tolist()}
    by = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r)
    pooled["by_category"] = {c: {"replay_tau": sum(r["replay_tokens"] for r in rs) / sum(r["replay_rounds"] for r in rs),
                                 "forced_tau": float(1 + np.concatenate([r["accepted"] for r in rs]).mean())}
                             for c, rs in by.items()}
    print(json.dumps(pooled))
    if args.out:
        Path(args.out).write_text(json.dumps({"export": args.export, "drafter": str(drafter_dir(args)),
                                              "chat": args.chat, "answers_from": args.answers, "pooled": pooled,
                                              "rows": rows}) + "\n")


def drafter_dir(args) -> Path:
    return Path(args.drafter or Path(args.export) / "drafter")


if __name__ == "__main__":
    main()
