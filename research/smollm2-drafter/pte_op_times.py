"""Where a `.pte` method's time goes, op by op: ExecuTorch's ETDump of the method run in the Python runtime
(its portable kernels outside XNNPACK, as `hyflash generate --backend executorch` runs them), zero inputs of the
manifest's shapes, 2 threads. Prints and writes ms per call by event name (XNNPACK's operators and the portable
kernels' `native_call_*`), summed over a call.

    .venv/bin/python research/smollm2-drafter/pte_op_times.py runs/exports/smol-pte-fp32 draft_read --out X.json
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import torch

from hyflash.runtime_py import ptekernels
from hyflash.runtime_py.backends import load_quantized_kernels

WARM, CALLS = 5, 20
DTYPES = {"float32": torch.float32, "int64": torch.int64}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("method")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ptekernels.load()  # the project's cache kernels, which the target's methods call
    load_quantized_kernels()  # int4 vocabulary tables (--quantize-embeddings)
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    ptekernels.set_threads(2)
    spec = json.loads((args.export / "manifest.json").read_text())["graphs"][args.method]
    inputs = tuple(torch.zeros(t["shape"], dtype=DTYPES[t["dtype"]]) for t in spec["inputs"])
    module = _load_for_executorch(str(args.export / spec["pte"]["file"]), enable_etdump=True, debug_buffer_size=0)
    for _ in range(WARM):
        module.run_method(spec["pte"]["method"], inputs)
    start = time.perf_counter()
    for _ in range(CALLS):
        module.run_method(spec["pte"]["method"], inputs)
    wall_ms = (time.perf_counter() - start) / CALLS * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "run.etdp"
        module.write_etdump_result_to_file(str(dump))
        inspector = Inspector(etdump_path=str(dump))
    total, count = collections.Counter(), collections.Counter()
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is not None:
                total[event.name] += sum(event.perf_data.raw)
                count[event.name] += len(event.perf_data.raw)
    calls = WARM + CALLS
    rows = [{"event": name, "ms_per_call": ms / calls, "per_call": count[name] / calls} for name, ms in total.most_common()]
    args.out.write_text(json.dumps({"export": str(args.export), "method": args.method, "threads": 2,
                                    "wall_ms_per_call": wall_ms, "events": rows}, indent=1) + "\n")
    print(f"{args.method}: {wall_ms:.2f} ms a call")
    for r in rows[:20]:
        print(f"{r['ms_per_call']:8.3f} ms  x{r['per_call']:<5.0f} {r['event']}")


if __name__ == "__main__":
    main()
