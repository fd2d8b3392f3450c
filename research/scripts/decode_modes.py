"""Is a graph's time stable from one minute to the next? The same calls as `hyflash profile` (decode and
verify at one committed length, a warm-up call and 15 back to back, the median), repeated ROUNDS times in a
row on each export, so that a machine whose speed switches between modes shows it. On the Intel machine of
session 13, ExecuTorch's decode at 1,024 tokens switched between ~3.3 and ~8 ms from one set of calls to the
next while onnxruntime's stayed put. Measure on an idle machine.
Usage: python research/scripts/decode_modes.py EXPORT:BACKEND [EXPORT:BACKEND ...] [--context 1024] [--rounds 20]
         > research/results/decode_modes.json"""

import argparse
import json
import statistics

from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.profile import call_times, prefill_time, profile_prompt

ap = argparse.ArgumentParser()
ap.add_argument("exports", nargs="+", help="FOLDER:BACKEND")
ap.add_argument("--context", type=int, default=1024)
ap.add_argument("--rounds", type=int, default=20)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

report = {"context": args.context, "threads": args.threads, "rounds": args.rounds, "runs": []}
for spec in args.exports:
    folder, backend = spec.rsplit(":", 1)
    rt = Runtime(folder, backend, threads=args.threads)
    prefill_time(rt, profile_prompt(rt, args.context))
    medians = {"target_decode": [], "target_verify": []}
    for _ in range(args.rounds):
        times = call_times(rt, args.context, 15)
        for g in medians:
            medians[g].append(statistics.median(times[g]))
    report["runs"].append({"export": folder, "backend": backend, "median_ms_by_round": medians,
                           "spread": {g: {"min": min(v), "median": statistics.median(v), "max": max(v)}
                                      for g, v in medians.items()}})
print(json.dumps(report, indent=1))
