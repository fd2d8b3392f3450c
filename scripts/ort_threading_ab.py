"""Which onnxruntime threading policy makes the loop fastest: every policy's Runtime in one process, each
held-out prompt through all of them in turn (speculative and target-only, 64 tokens), so the machine's
drift hits them alike. Policies (how `ort_session_options` sets a graph's session):
  sleeping-pools  every session `threads` threads, pools that sleep after a call (the runtime until 2026-12)
  target-spins    the target's sessions `threads` threads with spinning pools, the drafter's one thread (today's)
  drafter-sleeps  the target's pools spin, the drafter's have `threads` threads and sleep
  all-spin        every session `threads` threads, every pool spins (onnxruntime's default)
Output tokens must be the same under every policy. Measure on an idle machine.
Usage: python scripts/ort_threading_ab.py EXPORT [--contexts 256,1024,2048] [--prompts 6] [--threads 2] > results/x.json"""

import argparse
import json
import platform

import numpy as np
from tokenizers import Tokenizer

import hyflash.runtime_py.backends as backends
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def options(model_threads):
    """A policy from {(model, spin): threads or None for `threads`}: model in target/drafter."""
    def make(ort, model, threads):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        n, spin = model_threads[model]
        opts.intra_op_num_threads = n or threads or 0
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts
    return make


POLICIES = {
    "sleeping-pools": options({"target": (None, False), "drafter": (None, False)}),
    "target-spins": backends.ort_session_options,
    "drafter-sleeps": options({"target": (None, True), "drafter": (None, False)}),
    "all-spin": options({"target": (None, True), "drafter": (None, True)}),
}

ap = argparse.ArgumentParser()
ap.add_argument("export")
ap.add_argument("--contexts", default="256,1024,2048")
ap.add_argument("--prompts", type=int, default=6)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

runtimes = {}
for name, policy in POLICIES.items():
    backends.ort_session_options = policy  # read when the Runtime opens its sessions
    runtimes[name] = Runtime(args.export, threads=args.threads)
backends.ort_session_options = POLICIES["target-spins"]
ids = Tokenizer.from_file(f"{args.export}/tokenizer.json").encode(open("data/corpus/heldout.txt").read()).ids
report = {"export": args.export, "threads": args.threads, "machine": platform.processor() or platform.machine(),
          "new_tokens": 64, "rows": []}
for c in map(int, args.contexts.split(",")):
    prompts = [ids[i * 5000:i * 5000 + c] for i in range(args.prompts)]
    tps = {n: {"model": [], "none": []} for n in runtimes}
    for p in prompts:
        for draft in ("model", "none"):
            outputs = set()
            for name, rt in runtimes.items():
                stats = Stats()
                cfg = GenerationConfig(max_new_tokens=64, draft=draft, ignore_eos=True)
                outputs.add(tuple(t for chunk in rt.generate(p, cfg, stats) for t in chunk))
                tps[name][draft].append(stats.tokens_per_s)
            assert len(outputs) == 1, f"the policies' outputs differ at context {c}"
    row = {"context": c, "prompts": len(prompts)}
    for name, t in tps.items():
        row[name] = {"speculative_tokens_per_s": float(np.median(t["model"])),
                     "target_only_tokens_per_s": float(np.median(t["none"]))}
    report["rows"].append(row)
print(json.dumps(report, indent=1))
