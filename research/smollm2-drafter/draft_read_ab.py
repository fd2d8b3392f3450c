"""Two exports' ONNX `draft_read` timed side by side: the same inputs (a lookup block with tokens inside and
outside the draft vocabulary), their outputs compared bit for bit, then blocks of 20 calls each, interleaved
8 times, 2 threads, the runtime's own session options. Median ms per call.

    .venv/bin/python research/smollm2-drafter/draft_read_ab.py OLD_EXPORT NEW_EXPORT --out results/X.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from hyflash.runtime_py.backends import ort_session_options

LOOKUP = [12, 40000, 7, 999, 48000, 3, 25]  # SmolLM2 ids; some beyond the 16K draft vocabulary's


def session(folder: Path) -> tuple[ort.InferenceSession, dict]:
    spec = json.loads((folder / "manifest.json").read_text())["graphs"]["draft_read"]
    rng = np.random.default_rng(0)
    feeds = {t["name"]: (rng.integers(0, 100, t["shape"]) if t["dtype"] == "int64"
                         else 0.1 * rng.standard_normal(t["shape"])).astype(t["dtype"]) for t in spec["inputs"]}
    feeds["lookup_tokens"] = np.array(LOOKUP, dtype=np.int64)
    feeds["lookup_match"] = np.array([2], dtype=np.int64)
    return ort.InferenceSession(str(folder / spec["onnx"]), ort_session_options(ort, 2), providers=["CPUExecutionProvider"]), feeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs=2, type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = {str(e): session(e) for e in args.exports}
    outputs = [s.run(None, f) for s, f in runs.values()]
    same = all(np.array_equal(a, b) for a, b in zip(*outputs))
    blocks = {e: [] for e in runs}
    for _ in range(8):
        for e, (s, f) in runs.items():
            for _ in range(3):
                s.run(None, f)
            t = time.perf_counter()
            for _ in range(20):
                s.run(None, f)
            blocks[e].append((time.perf_counter() - t) / 20 * 1e3)
    report = {"graph": "draft_read", "threads": 2, "same_outputs": same,
              "median_ms": {e: float(np.median(v)) for e, v in blocks.items()}, "blocks_ms": blocks}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"same_outputs": same, "median_ms": {e: round(v, 2) for e, v in report["median_ms"].items()}}))


if __name__ == "__main__":
    main()
