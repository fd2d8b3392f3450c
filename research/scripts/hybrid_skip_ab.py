"""Hybrid drafting with and without skipping draft_read (--draft-cost), beside prompt-lookup and the drafter
alone: one Runtime, every held-out prompt through every mode in a fresh random order (greedy, 64 tokens), so
the machine's drift hits them alike. Output tokens must equal target-only's in every mode. Reports per bucket
tau, tokens/s relative to target-only (median over prompts), and the share of rounds that skipped draft_read.
Measure on an idle machine.
Usage: python research/scripts/hybrid_skip_ab.py EXPORT [--buckets 256,512,1024,2048] [--prompts 8] [--cost 0.2]
         > research/results/hybrid_skip_ab.json"""

import argparse
import json
import statistics

import numpy as np

from hyflash.runtime_py.bench import BenchConfig, export_tokenizer, make_prompts, run_once, source_texts
from hyflash.runtime_py.loop import Runtime

ap = argparse.ArgumentParser()
ap.add_argument("export")
ap.add_argument("--buckets", default="256,512,1024,2048")
ap.add_argument("--prompts", type=int, default=8)
ap.add_argument("--cost", type=float, default=0.2, help="the skipping mode's --draft-cost")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--max-new-tokens", type=int, default=64)
args = ap.parse_args()

rt = Runtime(args.export, threads=args.threads)
cfg = BenchConfig(artifacts=(rt.folder,), buckets=tuple(int(b) for b in args.buckets.split(",")),
                  prompts_per_bucket=args.prompts, max_new_tokens=args.max_new_tokens)
prompts = make_prompts(export_tokenizer(rt), source_texts(None), cfg, rt.usable_context)
MODES = {"target-only": ("none", 0.0), "drafter": ("model", 0.0), "prompt-lookup": ("prompt-lookup", 0.0),
         "hybrid, drafter every round": ("hybrid", 0.0), f"hybrid, --draft-cost {args.cost}": ("hybrid", args.cost)}
rng = np.random.default_rng(0)
report = {"export": args.export, "threads": args.threads, "max_new_tokens": args.max_new_tokens, "buckets": []}
for (lo, hi), bucket in prompts.items():
    per = {m: [] for m in MODES}
    for prompt in bucket:
        order = rng.permutation(len(MODES))
        for m in [list(MODES)[j] for j in order]:
            draft, cost = MODES[m]
            per[m].append(run_once(rt, prompt, draft, args.max_new_tokens, draft_cost=cost))
        base = per["target-only"][-1].tokens
        bad = [m for m in MODES if per[m][-1].tokens != base]
        assert not bad, f"{bad}: output differs from target-only's; this is a bug"
    rows = {}
    for m, st in per.items():
        rounds = sum(s.rounds for s in st)
        rows[m] = {"tau": float(np.mean([s.acceptance_length for s in st])) if m != "target-only" else 1.0,
                   "speedup": statistics.median(s.tokens_per_s / b.tokens_per_s for s, b in zip(st, per["target-only"])),
                   "skipped_read_share": sum(s.skipped_reads for s in st) / max(1, rounds),
                   "lookup_share": sum(s.lookup_rounds for s in st) / max(1, rounds)}
    report["buckets"].append({"bucket": f"{lo}-{hi}", "prompts": len(bucket), "modes": rows})
print(json.dumps(report, indent=1))
