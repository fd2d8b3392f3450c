"""Each graph's time per call inside the speculative loop against the same graph called back to back
(`hyflash profile`): what a round's neighbours cost a graph (the target's verify between two drafter calls
evicts their weights and activations; each session's pool wakes for its call). Greedy, held-out prompts
(64 tokens, 4 per bucket), the drafter and target-only in turn on one Runtime; the isolated figures are
`hyflash profile`'s medians at the bucket's lower edge. --twice adds a pass in which every drafter call of the
loop runs again at once (the same inputs; a drafter graph reads the current context copy and writes the other,
so the repeat changes nothing) and reports both calls' medians: what a graph costs when the call before it was
another graph, and when it was the same one. Measure on an idle machine.
Usage: python research/scripts/loop_graph_ms.py EXPORT [EXPORT ...] [--prompts 4] [--twice] > research/results/loop_graph_ms.json"""

import argparse
import datetime
import json
import statistics
import time
from collections import defaultdict

from hyflash.runtime_py.bench import BenchConfig, export_tokenizer, make_prompts, source_texts
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats
from hyflash.runtime_py.profile import profile

ap = argparse.ArgumentParser()
ap.add_argument("exports", nargs="+")
ap.add_argument("--buckets", default="256,512,1024,2048")
ap.add_argument("--prompts", type=int, default=4)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--twice", action="store_true", help="also time each drafter call and an immediate repeat of it")
args = ap.parse_args()

buckets = tuple(int(b) for b in args.buckets.split(","))
def call_then_repeat(rt: Runtime, bucket: list[list[int]]) -> dict:
    """Greedy generation with every drafter call run twice in a row: each graph's median first and second call."""
    first, second = defaultdict(list), defaultdict(list)
    run = rt._run

    def twice(graph, call, stats):
        if stats is None or stats.phase != "decode" or graph.startswith("target_"):
            return run(graph, call, stats)
        for times in (first, second):
            t = time.perf_counter()
            call.run()
            times[graph].append((time.perf_counter() - t) * 1e3)

    rt._run = twice
    try:
        for prompt in bucket:
            for _ in rt.generate(prompt, GenerationConfig(max_new_tokens=64, draft="model", ignore_eos=True), Stats()):
                pass
    finally:
        del rt._run
    return {g: {"first": statistics.median(first[g]), "repeat": statistics.median(second[g])} for g in first}


cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
report = {"cpu": cpu, "date": datetime.date.today().isoformat(), "threads": args.threads,
          "prompts_per_bucket": args.prompts, "max_new_tokens": 64, "exports": []}
for folder in args.exports:
    rt = Runtime(folder, threads=args.threads)
    cfg = BenchConfig(artifacts=(rt.folder,), buckets=buckets, prompts_per_bucket=args.prompts, max_new_tokens=64)
    prompts = make_prompts(export_tokenizer(rt), source_texts(None), cfg, rt.usable_context)
    isolated = {row["context"]: row["graph_ms"] for row in
                profile(rt.folder, contexts=tuple(lo for lo, _ in prompts), threads=args.threads, optimum=False,
                        progress=False)["rows"]}
    rows = []
    for (lo, hi), bucket in prompts.items():
        row = {"bucket": [lo, hi], "isolated_ms": isolated[lo]}
        for draft in ("model", "none"):
            ms, calls, wall, rounds = defaultdict(float), defaultdict(int), 0.0, 0
            for prompt in bucket:
                st = Stats()
                for _ in rt.generate(prompt, GenerationConfig(max_new_tokens=64, draft=draft, ignore_eos=True), st):
                    pass
                wall, rounds = wall + st.decode_s * 1e3, rounds + (st.rounds or len(st.tokens) - 1)
                for k, v in st.graph_ms.items():
                    if not k.startswith("prefill/"):
                        ms[k], calls[k] = ms[k] + v, calls[k] + st.graph_calls[k]
            row[draft] = {"in_loop_ms": {k: ms[k] / calls[k] for k in ms}, "ms_per_round": wall / rounds,
                          "graph_ms_per_round": sum(ms.values()) / rounds}
        if args.twice:
            row["drafter_call_then_repeat_ms"] = call_then_repeat(rt, bucket)
        rows.append(row)
    report["exports"].append({"export": folder, "rows": rows})
print(json.dumps(report, indent=1))
