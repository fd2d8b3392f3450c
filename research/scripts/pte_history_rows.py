"""Does the next step depend on how the history's cache rows were written? A random 300-token prompt is
prefilled, five tokens are decoded one at a time, and the sixth token's logits taken; then the prompt and
the five tokens are prefilled together (in chunks) and the same step taken. The greatest |logit difference|
per export: what separates an app that keeps a conversation's cache from one that re-prefills its history.

  python research/scripts/pte_history_rows.py LABEL=EXPORT ... --out research/.../X.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hyflash.runtime_py.loop import Runtime, Stats


def history_gap(runtime: Runtime, seed: int, prefix: int = 300, steps: int = 5) -> float:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, runtime.vocab, prefix).tolist()
    tokens = rng.integers(3, runtime.vocab, steps + 1).tolist()
    runtime.prefill(prompt, False, Stats())
    for i in range(steps):  # the history's last rows written by decode steps
        runtime.run_target("target_decode", [tokens[i]], prefix + i)
        runtime.commit_rows([tokens[i]], prefix + i)
    kept = runtime.run_target("target_decode", [tokens[steps]], prefix + steps)[0][0].copy()
    runtime.prefill(prompt + tokens[:steps], False, Stats())  # the same history prefilled in chunks
    again = runtime.run_target("target_decode", [tokens[steps]], prefix + steps)[0][0].copy()
    return float(np.abs(kept - again).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("exports", nargs="+", help="LABEL=EXPORT")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    report = {}
    for item in a.exports:
        label, folder = item.split("=", 1)
        runtime = Runtime(Path(folder), "executorch", 2)
        gaps = [history_gap(runtime, seed) for seed in range(a.seeds)]
        report[label] = {"export": folder, "max_abs_logit_difference": gaps}
        print(f"{label:24s} {' '.join(f'{g:.3g}' for g in gaps)}")
    a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
