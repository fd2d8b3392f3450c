"""How far a verify block's rows are from the decode steps at their positions, per export: the
greatest |logit difference| over each block's 8 rows, for random blocks after a random prefix. Run
by research/scripts/pte_verify_rows.sh on `.pte` exports made with the verify block attending in one call
and row by row, fp32 and int4 (8da4w) targets.

  python research/scripts/pte_verify_drift.py LABEL=EXPORT ... [--blocks 12] [--prefix 264] --out research/results/X.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hyflash.runtime_py.loop import Runtime, Stats
from hyflash.runtime_py.manifest import VERIFY_ROWS


def block_drift(runtime: Runtime, seed: int, prefix: int) -> float:
    """A seeded random prefix prefilled, a seeded random block verified, then each of its tokens decoded at
    its position: the largest |verify row - decode step| in the logits."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, runtime.vocab, prefix).tolist()
    block = rng.integers(3, runtime.vocab, VERIFY_ROWS).tolist()
    runtime.prefill(prompt, False, Stats())
    verify = runtime.run_target("target_verify", block, prefix)[0].copy()
    worst = 0.0
    for i, token in enumerate(block):
        decode = runtime.run_target("target_decode", [token], prefix + i)[0][0]
        worst = max(worst, float(np.abs(decode - verify[i]).max()))
        runtime.commit_rows([token], prefix + i)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs="+", help="LABEL=EXPORT_FOLDER")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--prefix", type=int, default=264)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    report = {"backend": "executorch", "blocks": args.blocks, "prefix": args.prefix, "exports": {}}
    for item in args.exports:
        label, folder = item.split("=", 1)
        runtime = Runtime(folder, "executorch", threads=2)
        drift = [block_drift(runtime, seed, args.prefix) for seed in range(args.blocks)]
        report["exports"][label] = {"folder": folder, "worst_per_block": drift,
                                    "blocks_over_1e-4": sum(d > 1e-4 for d in drift), "worst": max(drift)}
        print(f"{label:<24} worst {max(drift):.3g}, blocks over 1e-4: {sum(d > 1e-4 for d in drift)} of {args.blocks}")
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
