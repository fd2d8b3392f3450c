"""Which way of timing gives the width rule steadier costs? `hyflash profile` times each graph's calls at one
committed length; here the same calls (`hyflash.runtime_py.profile.loop_calls`) are timed both ways, taking
turns, ROUNDS times: `back_to_back` (a warm-up call, then each graph's REPEATS calls in a row, graph after graph:
how profile times them) and `interleaved` (a warm-up round, then REPEATS rounds of one call of each, so that a
drift in the machine's speed would land on every graph alike). For each way, the ratios the rule reads (each verify width and
draft_read over a decode step) from each of the ROUNDS measurements, and their spread. Measure on an idle machine.
Usage: python research/scripts/profile_rounds_ab.py EXPORT [--backend onnxruntime] [--context 256] [--rounds 8]
         [--repeats 15] --out research/smollm2-drafter/results/profile_rounds_ab.json"""

import argparse
import json
import statistics
import time
from pathlib import Path

from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.profile import back_to_back, loop_calls, prefill_time, profile_prompt


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def interleaved(calls, repeats):
    """A warm-up round, then `repeats` rounds of one call of each (profile's own way is `back_to_back`)."""
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(timed(fn))
    return times


ap = argparse.ArgumentParser()
ap.add_argument("export")
ap.add_argument("--backend", default="onnxruntime")
ap.add_argument("--context", type=int, default=256)
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--repeats", type=int, default=15)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--out", type=Path, required=True)
args = ap.parse_args()

rt = Runtime(args.export, args.backend, threads=args.threads)
prefill_time(rt, profile_prompt(rt, args.context))
step = rt.contract.step_graph
ways = {"back_to_back": back_to_back, "interleaved": interleaved}
ratios = {way: [] for way in ways}
for r in range(args.rounds):
    for way, timer in (ways.items() if r % 2 == 0 else reversed(ways.items())):
        ms = {g: statistics.median(t) for g, t in timer(loop_calls(rt, args.context), args.repeats).items()}
        ratios[way].append({"decode_ms": ms[step], **{g: ms[g] / ms[step] for g in ms if g != step}})
    print(f"round {r + 1}/{args.rounds}", flush=True)
report = {"export": args.export, "backend": args.backend, "context": args.context, "rounds": args.rounds,
          "repeats": args.repeats, "threads": args.threads, "step_graph": step, "by_round": ratios,
          "spread": {way: {k: {"min": min(v[k] for v in rows), "median": statistics.median(v[k] for v in rows),
                               "max": max(v[k] for v in rows)} for k in rows[0]} for way, rows in ratios.items()}}
args.out.parent.mkdir(parents=True, exist_ok=True)
args.out.write_text(json.dumps(report, indent=1) + "\n")
for way, spread in report["spread"].items():
    print(way, "  ".join(f"{k} {v['min']:.2f}-{v['max']:.2f}" for k, v in spread.items()))
