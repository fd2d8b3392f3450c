"""Which onnxruntime threading policy makes the loop fastest: every policy's Runtime in one process, each
held-out prompt through all of them in turn (speculative and target-only, 64 tokens), so the machine's
drift hits them alike. Policies (how `ort_session_options` sets a graph's session):
  sleeping-pools    every session `threads` threads, pools that sleep after each task (the runtime until 2026-12)
  runtime           `ort_session_options`, what the runtime does now
  target-spins      the target's sessions `threads` threads, spinning; the drafter's one thread
  all-spin-in-call  every session `threads` threads, spinning while a call runs, stopping when it returns
  drafter-one-thread  the target's as all-spin-in-call, the drafter's sessions one thread (no pool to wake)
(Every pool spinning after its calls too, onnxruntime's default, ran the drafters at 0.3x: left out, its
lingering spin would slow whichever policy runs next.) "runtime" and "all-spin-in-call" are the same
policy now, so their difference is the noise floor; "target-spins" was the runtime's for a day. The
policies run in a fresh random order for every prompt. Output tokens must be the same under every
policy, speculative and target-only. Measure on an idle machine.
Written when `ort_session_options(ort, model, threads)` took the graph's model; run it at that commit
(research/scripts/at_commit.sh 5d25a24 ...), the runtime's function now takes (ort, threads).
Usage: python research/scripts/ort_threading_ab.py EXPORT [--contexts 256,1024,2048] [--prompts 6] [--threads 2]
    > research/results/x.json"""

import argparse
import json
import os
import platform

import numpy as np
from tokenizers import Tokenizer

import hyflash.runtime_py.backends as backends
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def options(policy):
    """A policy from {model: (threads or None for `threads`, spin)}, model in target/drafter; spin is
    False (the pool sleeps after each task), True (spins, and keeps spinning after the call returns) or
    "in-call" (spins, and stops when the call returns: session.force_spinning_stop)."""
    def make(ort, model, threads):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        n, spin = policy[model]
        opts.intra_op_num_threads = n or threads or 0
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if spin == "in-call":
            opts.add_session_config_entry("session.force_spinning_stop", "1")
        return opts
    return make


POLICIES = {
    "sleeping-pools": options({"target": (None, False), "drafter": (None, False)}),
    "runtime": backends.ort_session_options,  # what the runtime does today
    "target-spins": options({"target": (None, True), "drafter": (1, False)}),
    "all-spin-in-call": options({"target": (None, "in-call"), "drafter": (None, "in-call")}),
    "drafter-one-thread": options({"target": (None, "in-call"), "drafter": (1, "in-call")}),
}

def machine() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.machine()


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
backends.ort_session_options = POLICIES["runtime"]
ids = Tokenizer.from_file(f"{args.export}/tokenizer.json").encode(open("data/corpus/heldout.txt").read()).ids
report = {"export": args.export, "threads": args.threads, "machine": machine(),
          "new_tokens": 64, "rows": []}
rng = np.random.default_rng(0)
for c in map(int, args.contexts.split(",")):
    prompts = [ids[i * 5000:i * 5000 + c] for i in range(args.prompts)]
    tps = {n: {"model": [], "none": []} for n in runtimes}
    for p in prompts:
        done = {}
        for draft in ("model", "none"):
            outputs = set()
            for name in rng.permutation(list(runtimes)):  # a fresh order each time: no policy always follows another
                rt = runtimes[name]
                stats = Stats()
                cfg = GenerationConfig(max_new_tokens=64, draft=draft, ignore_eos=True)
                outputs.add(tuple(t for chunk in rt.generate(p, cfg, stats) for t in chunk))
                tps[name][draft].append(stats.tokens_per_s)
            assert len(outputs) == 1, f"the policies' outputs differ at context {c}"
            done.setdefault(draft, outputs.pop())
        assert done["model"] == done["none"], f"speculative output differs from target-only at context {c}"
    row = {"context": c, "prompts": len(prompts)}
    for name, t in tps.items():
        row[name] = {"speculative_tokens_per_s": float(np.median(t["model"])),
                     "target_only_tokens_per_s": float(np.median(t["none"]))}
    report["rows"].append(row)
print(json.dumps(report, indent=1))
