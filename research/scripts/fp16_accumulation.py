"""Issue 17: why an fp16 export agrees less with fp32 on ExecuTorch than on onnxruntime. One fp16 linear layer
(8 rows, 512 outputs, K inputs, fp16 weights and inputs) run on each backend's CPU kernels and compared with
the exact product of the same fp16 numbers (float64). If a backend accumulates in fp32 and rounds the
result to fp16 once, its error equals that rounding (`round_only`, independent of K); if it accumulates in
fp16, its error grows with K.

    .venv/bin/python research/scripts/fp16_accumulation.py [--k 256,1024,4096] [--out research/results/fp16_accumulation.json]
"""

from __future__ import annotations

import argparse
import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


def executorch_out(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    program = to_edge_transform_and_lower(torch.export.export(module, (x,)),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    return method.execute([x])[0]


def onnxruntime_out(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, dynamo=True, verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="256,1024,4096")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "fp16_accumulation.json")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for k in (int(v) for v in a.k.split(",")):
        layer = torch.nn.Linear(k, 512, bias=False).half()
        x = torch.randn(8, k).half()
        exact = x.double() @ layer.weight.double().T
        round_only = (exact.half().double() - exact).abs().max().item()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            errors = {name: (fn(layer, x).double() - exact).abs().max().item()
                      for name, fn in (("executorch", executorch_out), ("onnxruntime", onnxruntime_out))}
        rows.append({"k": k, "scale": exact.abs().max().item(), "round_only": round_only, **errors,
                     **{f"{name}_vs_round_only": err / round_only for name, err in errors.items()}})
        print(json.dumps(rows[-1]))
    a.out.write_text(json.dumps({"rows": rows, "numpy": np.__version__, "torch": torch.__version__}, indent=1) + "\n")


if __name__ == "__main__":
    main()
