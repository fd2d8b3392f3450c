"""Does onnxruntime's GroupQueryAttention give a query row the same output whatever the rows beside it?

The whole int4 target at int8 compute gives verify rows that differ from decode steps (verify_rows.py)
although its MatMulNBits nodes are row-stable (matmulnbits_rows.py); the attention is the other op whose
work depends on the number of rows. One GroupQueryAttention node at SmolLM2-135M's geometry (9 heads, 3
KV heads of 64, a cache of 1,024 rows, 300 filled) answers S = 1, 2, 4, 8 new rows; each row's output is
compared with the same row computed alone (S = 1 at its position, the cache holding the rows before it)
and with the rows computed two at a time; the largest difference per S is written to results/gqa_rows.json.

    .venv/bin/python research/int8-verify/gqa_rows.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV, HD, T, FILLED = 9, 3, 64, 1024, 300


def model(s: int) -> onnx.ModelProto:
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, s, HEADS * HD]),
              helper.make_tensor_value_info("k", f, [1, s, KV * HD]),
              helper.make_tensor_value_info("v", f, [1, s, KV * HD]),
              helper.make_tensor_value_info("past_k", f, [1, KV, T, HD]),
              helper.make_tensor_value_info("past_v", f, [1, KV, T, HD]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("out", f, [1, s, HEADS * HD]),
               helper.make_tensor_value_info("present_k", f, [1, KV, T, HD]),
               helper.make_tensor_value_info("present_v", f, [1, KV, T, HD])]
    node = helper.make_node("GroupQueryAttention", [i.name for i in inputs], [o.name for o in outputs],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV)
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def main() -> None:
    rng = np.random.default_rng(0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sessions = {s: ort.InferenceSession(model(s).SerializeToString(), opts, providers=["CPUExecutionProvider"])
                for s in (1, 2, 4, 8)}
    rows = 64
    q = rng.standard_normal((rows, HEADS * HD)).astype(np.float32)
    k = rng.standard_normal((rows, KV * HD)).astype(np.float32)
    v = rng.standard_normal((rows, KV * HD)).astype(np.float32)
    cache_k = np.zeros((1, KV, T, HD), np.float32)
    cache_v = np.zeros((1, KV, T, HD), np.float32)
    cache_k[:, :, :FILLED] = rng.standard_normal((1, KV, FILLED, HD))
    cache_v[:, :, :FILLED] = rng.standard_normal((1, KV, FILLED, HD))

    def run(s, start, pk, pv):
        feed = {"q": q[start - FILLED:start - FILLED + s][None], "k": k[start - FILLED:start - FILLED + s][None],
                "v": v[start - FILLED:start - FILLED + s][None], "past_k": pk, "past_v": pv,
                "seqlens_k": np.array([start + s - 1], np.int32), "total": np.array(start + s, np.int32)}
        return sessions[s].run(None, feed)

    alone, pk, pv = [], cache_k, cache_v  # every row decoded one at a time, the cache growing
    for r in range(rows):
        out, pk, pv = run(1, FILLED + r, pk, pv)
        alone.append(out[0, 0])
    alone = np.stack(alone)
    result = {"heads": HEADS, "kv_heads": KV, "head_dim": HD, "cache_rows": T, "filled": FILLED, "by_rows": {}}
    pairs = None
    for s in (1, 2, 4, 8):
        got, pk, pv = [], cache_k, cache_v
        for start in range(FILLED, FILLED + rows, s):
            out, pk, pv = run(s, start, pk, pv)
            got.append(out[0])
        got = np.concatenate(got)
        pairs = got if s == 2 else pairs
        result["by_rows"][str(s)] = {"max_abs_diff_vs_alone": float(np.abs(got - alone).max()),
                                     "bit_equal_rows": int((got == alone).all(-1).sum()),
                                     "max_abs_diff_vs_2_rows": float(np.abs(got - pairs).max()) if s > 1 else None,
                                     "bit_equal_rows_vs_2_rows": int((got == pairs).all(-1).sum()) if s > 1 else None,
                                     "rows": rows}
        print(s, result["by_rows"][str(s)])
    dest = Path(__file__).parent / "results/gqa_rows.json"
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
