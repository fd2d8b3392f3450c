"""Does onnxruntime's MatMulNBits give a row the same result whatever the number of rows beside it?

A speculative loop is exact (greedy output = target-only output) only if a verify block's row i is what
decoding that token alone gives. This builds one int4 MatMulNBits node at SmolLM2-135M's geometry
(576 -> 1536, the MLP's up projection, and 1536 -> 576, its down projection), runs the same rows with
M = 1, 2, 4, 8 and 64 rows in the call, and reports, per accuracy level and block size, the largest
difference between a row's result in an M-row call and in the 1-row and 2-row calls, plus the median
ms per call (2 threads). Raw JSON to research/int8-verify/results/matmulnbits_rows.json.

    .venv/bin/python research/int8-verify/matmulnbits_rows.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

ROWS = (1, 2, 4, 8, 64)
SHAPES = ((576, 1536), (1536, 576))
OUT = Path(__file__).parent / "results" / "matmulnbits_rows.json"


def matmul_model(k: int, n: int, rng) -> onnx.ModelProto:
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(proto, path)
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def median_ms(sess, x, repeats: int = 50) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def measure(k: int, n: int, accuracy: int, block: int, rng) -> dict:
    q = MatMulNBitsQuantizer(matmul_model(k, n, rng), bits=4, block_size=block, is_symmetric=False,
                             accuracy_level=accuracy)
    q.process()
    sess = session(q.model.model)
    x = (rng.standard_normal((max(ROWS), k))).astype(np.float32)
    alone = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(max(ROWS))])
    paired = np.concatenate([sess.run(None, {"x": x[i:i + 2]})[0][:1] for i in range(max(ROWS))])
    row = {"k": k, "n": n, "accuracy_level": accuracy, "block": block, "by_rows": {}}
    for m in ROWS:
        y = np.concatenate([sess.run(None, {"x": x[i:i + m]})[0] for i in range(0, max(ROWS), m)])
        row["by_rows"][str(m)] = {"max_diff_vs_1_row": float(np.abs(y - alone).max()),
                                  "max_diff_vs_2_rows": float(np.abs(y - paired).max()),
                                  "ms": median_ms(sess, x[:m])}
    return row


def main() -> None:
    rng = np.random.default_rng(0)
    rows = [measure(k, n, acc, block, rng) for k, n in SHAPES for acc in (0, 4) for block in (32, 128)]
    for r in rows:
        cells = "  ".join(f"M={m}: {v['max_diff_vs_1_row']:.1e}/{v['max_diff_vs_2_rows']:.1e} {v['ms']:.3f}ms"
                          for m, v in r["by_rows"].items())
        print(f"{r['k']}x{r['n']} acc{r['accuracy_level']} b{r['block']}: {cells}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"onnxruntime": ort.__version__, "threads": 2, "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
