"""Does a whole int4 target export give each verify row what decoding that token alone gives, bit for bit?

The greedy speculative loop equals target-only decoding only if it does. The product's int4 ONNX target
computes in fp32 (MatMulNBits accuracy_level 0, export.quantize.ACCURACY); one MatMulNBits node at int8
compute with block 32 gave bit-equal rows (matmulnbits_rows.py). This exports SmolLM2-135M-Instruct's
int4 ONNX target both ways (accuracy 0, the product's; accuracy 4, int8 compute, the same block 32 and
int4 vocabulary tables), prefills 256 tokens of a regenerated chat, then at 24 places per width verifies a
block of w rows and decodes the same w tokens one at a time (by the one-row decode graph, and by the
two-row verify graph with a padding row, whose attention takes onnxruntime's several-row path as every
verify does: gqa_rows.py): the largest logit difference between a
verify row and its decode step, whether the argmaxes agree, and the median ms of a verify and of a
decode step (2 threads; an idle machine gives the times meaning). Raw JSON to results/verify_rows.json.

    .venv/bin/python research/int8-verify/verify_rows.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXPORTS = ROOT / "runs/exports"
PLACES = 24


def export(accuracy: int) -> Path:
    from hyflash.export import quantize
    from hyflash.export.pipeline import ExportConfig
    from hyflash.export.pipeline import export as run_export
    from hyflash.models.loading import resolve

    out = EXPORTS / f"smol-int4-acc{accuracy}"
    if (out / "manifest.json").is_file():
        return out
    quantize.ACCURACY["target"] = accuracy
    run_export(ExportConfig(target=resolve("smollm2-135m-instruct", "target"), drafter="smollm2-135m-instruct",
                            out=out, formats=("onnx",), quantize_target="int4", quantize_embeddings="int4"))
    return out


def text() -> list[int]:
    with np.load(ROOT / "data/chat/smollm2-regen/shard-00000.npz") as z:
        row = int(np.argmax(z["length"]))
        return z["tokens"][row, :int(z["length"][row])].tolist()


def measure(folder: Path, tokens: list[int], decode_rows: int = 1) -> dict:
    from hyflash.runtime_py.loop import Runtime
    from hyflash.runtime_py.manifest import verify_graph

    rt = Runtime(folder, "onnxruntime", threads=2)
    out = {"export": folder.name, "decode_rows": decode_rows, "widths": {}}
    decode = "target_decode" if decode_rows == 1 else verify_graph(decode_rows)
    rng = np.random.default_rng(0)
    for w in rt.contract.verify_widths:
        rt.cache.reset()
        pos = 0
        while pos < 256:
            n = min(rt.chunk, 256 - pos)
            rt.run_target("target_prefill", tokens[pos:pos + n], pos)
            rt.cache.commit(pos, n)
            pos += n
        worst, agree, rows, equal, verify_ms, decode_ms = 0.0, 0, 0, 0, [], []
        for _ in range(PLACES):
            t = time.perf_counter()
            block, _ = rt.run_target(verify_graph(w), tokens[pos:pos + w], pos)
            verify_ms.append((time.perf_counter() - t) * 1e3)
            block = block[:w].copy()
            for i in range(w):
                t = time.perf_counter()
                step, _ = rt.run_target(decode, tokens[pos + i:pos + i + 1], pos + i)  # a pad row after it
                decode_ms.append((time.perf_counter() - t) * 1e3)
                rt.cache.commit(pos + i, 1)
                worst = max(worst, float(np.abs(block[i] - step[0]).max()))
                agree += int(block[i].argmax() == step[0].argmax())
                equal += int(np.array_equal(block[i], step[0]))
                rows += 1
            pos += int(rng.integers(1, w + 1)) if pos + 2 * w < len(tokens) - 8 else 0
        out["widths"][str(w)] = {"rows": rows, "max_abs_logit_diff": worst, "argmax_agree": agree,
                                 "bit_equal_rows": equal, "verify_ms": round(float(np.median(verify_ms)), 2),
                                 "decode_ms": round(float(np.median(decode_ms)), 2),
                                 "verify_in_decodes": round(float(np.median(verify_ms) / np.median(decode_ms)), 2)}
        print(folder.name, decode_rows, w, out["widths"][str(w)], flush=True)
    return out


def main() -> None:
    tokens = text()
    results = [measure(export(a), tokens, rows) for a in (0, 4) for rows in (1, 2)]
    dest = Path(__file__).parent / "results/verify_rows.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps({"text_tokens": len(tokens), "prefill": 256, "places": PLACES, "threads": 2,
                                "exports": results}, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
