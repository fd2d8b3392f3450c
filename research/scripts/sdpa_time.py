"""What the `.pte` attention kernel (`llama::custom_sdpa`, runtime_cpp/src/kernels.cc) costs on its own, at
SmolLM2-135M's shapes (9 query heads over 3 KV heads, head size 64, 30 layers' worth of calls): one-op programs
of 1, 2, 4 and 8 rows at several committed lengths, median ms of 30 calls (a step's layers), 2 threads. Each
LABEL=LIB runs in its own process (a loaded kernels library stays registered), the runs alternating for
--rounds rounds; raw JSON to --out.

    .venv/bin/python research/scripts/sdpa_time.py base=/tmp/lib_base.so new=build/runtime_cpp/libhyflash_kernels.so \
        --rounds 3 --out research/pte-kernels/results/sdpa_time.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
from hyflash.runtime_py import ptekernels

ptekernels.load()
ptekernels.set_threads(THREADS)
from executorch.runtime import Runtime

class Attend(torch.nn.Module):
    def forward(self, q, k, v, start):
        s = start.item()
        torch._check_is_size(s)
        torch._check(s + q.shape[1] <= k.shape[1])
        return torch.ops.llama.custom_sdpa(q, k, v, s, None, 0, True)

T, programs, found, rng = 2048, [], {}, np.random.default_rng(0)
k, v = (torch.from_numpy(rng.standard_normal((1, T, 3, 64)).astype(np.float32)) for _ in range(2))
for rows in ROWS:
    args = (torch.zeros(1, rows, 9, 64), torch.zeros(1, T, 3, 64), torch.zeros(1, T, 3, 64), torch.tensor(0))
    programs.append(Runtime.get().load_program(
        to_edge_transform_and_lower(torch.export.export(Attend(), args)).to_executorch().buffer))
    method = programs[-1].load_method("forward")
    q = torch.from_numpy(rng.standard_normal((1, rows, 9, 64)).astype(np.float32))
    for context in CONTEXTS:
        inputs = [q, k, v, torch.tensor(context)]
        for _ in range(30):
            method.execute(inputs)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(30):
                method.execute(inputs)
            times.append((time.perf_counter() - start) * 1e3)
        found[f"{rows}@{context}"] = float(np.median(times))
print(json.dumps(found))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=LIB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    code = (CHILD.replace("THREADS", str(args.threads)).replace("REPEATS", str(args.repeats))
            .replace("ROWS", f"[{args.rows}]").replace("CONTEXTS", f"[{args.contexts}]"))
    runs = dict(r.split("=", 1) for r in args.runs)
    rounds = {label: [] for label in runs}
    for i in range(args.rounds):
        for label, lib in runs.items():
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 env={**os.environ, "HYFLASH_KERNELS_LIB": str(Path(lib).resolve())})
            if out.returncode:
                sys.exit(f"{label}: {out.stderr[-1500:]}")
            rounds[label].append(json.loads(out.stdout.splitlines()[-1]))
            print(f"round {i + 1} {label}: " + "  ".join(f"{k} {v:.2f}" for k, v in rounds[label][-1].items()),
                  flush=True)
    medians = {label: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for label, rs in rounds.items()}
    for label, m in medians.items():
        print(f"{label:>10}: " + "  ".join(f"{k} {v:.2f} ms" for k, v in m.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"what": "ms of 30 custom_sdpa calls (SmolLM2-135M: 9 query heads, 3 KV heads, "
                                    "head size 64), rows@committed length, median of rounds", "threads": args.threads,
                                    "runs": runs, "medians": medians, "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
