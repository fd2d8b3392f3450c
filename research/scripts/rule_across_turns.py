"""Would the width rule gain from keeping its account across a conversation's turns?

Each turn of a conversation starts the width rule afresh: its rate from plain decoding's, the drafter not
resting, the chains' corrections at 1 (docs/design.md, "Verify widths"). This runs each multi-turn
conversation of the held-out set once an arm per export and drafting mode, the arms' order turning round: as the
runtime does ("afresh"), and with the account of the turn before kept ("kept": the runtime's width policy
handed from one turn to the next of the conversation, whose context is kept), and with only the drafter's
cool-down kept ("cooldown": a fresh rule that starts from the turn before's cool-down and the rest under way,
its rate and the chains' corrections afresh). Same tokens every way (checked); the figure is decode tokens/s
on the turns after the first, where the arms can differ.
(Commit 9bdacb3 built "kept" into both runtimes; measured with it, it was reverted.)

    .venv/bin/python research/scripts/rule_across_turns.py fp32=runs/exports/smol-hf-fp32-soft05c \\
        int8c=runs/exports/smol-hf-int8c --threads 2 --out research/smollm2-drafter/results/rule_across_turns.json
    .venv/bin/python research/scripts/rule_across_turns.py int4-pte=runs/exports/smol-pte-int4 --backend executorch \\
        --threads 2 --out research/smollm2-drafter/results/rule_across_turns_pte_int4.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from hyflash.runtime_py import chatbench, loop
from hyflash.runtime_py.chatbench import machine, read_chats
from hyflash.runtime_py.loop import Runtime, Stats
from hyflash.runtime_py.verifying import RuleWidth

ARMS = ("afresh", "kept", "cooldown")


def converse(runtime: Runtime, tokenizer, turns: list[str], mode: str, max_new: int, arm: str) -> list[Stats]:
    """chatbench's conversation; `arm` says what of the turn before's width policy a later turn keeps."""
    made, policies = loop.policy_for, []

    def policy_for(*args):
        if not policies or arm == "afresh" or not isinstance(policies[-1], RuleWidth):
            policies.append(made(*args))
        elif arm == "kept":
            policies.append(policies[-1])
        else:  # the drafter's cool-down and the rest under way, nothing else
            fresh, before = made(*args), policies[-1].rule
            fresh.rule.cooldown, fresh.rule.wait = before.cooldown, before.wait
            fresh.rule.rest_commit_rows = before.rest_commit_rows
            policies.append(fresh)
        return policies[-1]

    loop.policy_for = policy_for
    try:
        out = chatbench.converse(runtime, tokenizer, turns, mode, max_new)
    finally:
        loop.policy_for = made
    assert all(s.prefilled < s.prompt_tokens for s in out[1:])  # later turns kept the context
    return out


def pooled(stats: list[Stats]) -> dict:
    tokens = sum(len(s.tokens) - 1 for s in stats)  # decode tokens: the first comes from prefill
    seconds = sum(s.decode_s for s in stats)
    return {"turns": len(stats), "decode_tokens": tokens, "decode_s": seconds, "tokens_per_s": tokens / seconds,
            "tau": sum(len(s.tokens) for s in stats) / rounds if (rounds := sum(s.rounds for s in stats)) else None,
            "draft_reads": sum(s.graph_calls.get("draft_read", 0) for s in stats),
            "rested_rounds": sum(s.rested_rounds for s in stats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs="+", help="label=folder, each with its backend's costs written")
    ap.add_argument("--chat", default="data/chat/heldout.jsonl")
    ap.add_argument("--category", default="multi-turn")
    ap.add_argument("--modes", default="model@rule,prompt-lookup@rule")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--arms", default="afresh,kept", help=f"of {', '.join(ARMS)}, comma-separated")
    ap.add_argument("--repeats", type=int, default=1,
                    help="each conversation this many times an arm; the arms' order turns round each time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="onnxruntime", help="onnxruntime or executorch (a .pte export)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    chosen = args.arms.split(",")
    if "afresh" not in chosen or set(chosen) - set(ARMS):
        ap.error(f"--arms must name afresh and others of {', '.join(ARMS)}, got {args.arms!r}")
    chats = [c for c in read_chats(Path(args.chat)) if c["category"] == args.category]
    report = {"machine": machine(args.threads), "backend": args.backend, "chat": args.chat, "category": args.category,
              "conversations": len(chats), "max_new_tokens": args.max_new_tokens, "exports": {}}
    for spec in args.exports:
        label, _, folder = spec.partition("=")
        runtime = Runtime(folder, args.backend, args.threads)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        rows = {}
        for mode in ["none", *args.modes.split(",")]:
            arms = {arm: [] for arm in (chosen if mode != "none" else ["afresh"])}
            for r in range(args.repeats):
                for i, chat in enumerate(chats):
                    shift = (r + i) % len(arms)
                    order = list(arms)[shift:] + list(arms)[:shift]
                    runs = {arm: converse(runtime, tokenizer, chat["turns"], mode, args.max_new_tokens, arm)
                            for arm in order}
                    for arm, stats in runs.items():
                        arms[arm].append(stats)
                    answers = {arm: [s.tokens for s in stats] for arm, stats in runs.items()}
                    assert all(a == answers[order[0]] for a in answers.values()), (mode, i)
                    print(f"{label} {mode} repeat {r + 1} conversation {i + 1}/{len(chats)}", flush=True)
            rows[mode] = {arm: {"later_turns": pooled([s for conv in convs for s in conv[1:]]),
                                "all_turns": pooled([s for conv in convs for s in conv])}
                          for arm, convs in arms.items()}
            for arm, row in rows[mode].items():
                print(f"  {mode:22} {arm:7} later turns {row['later_turns']['tokens_per_s']:6.1f} tok/s, "
                      f"all {row['all_turns']['tokens_per_s']:6.1f}, draft_read {row['all_turns']['draft_reads']}",
                      flush=True)
        report["exports"][label] = {"folder": folder, "modes": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
