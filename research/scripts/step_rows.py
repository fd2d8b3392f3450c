"""Does each verify row of an export give what its single-token step gives, bit for bit, with the step run by
the one-row `target_decode` and by the two-row `target_verify_2` (its second row padding)? The greedy loop
equals target-only decoding only where it does. `hyflash.export.validate.step_rows_agree` on the export, the
step graph set each way in turn: six blocks a verify width after a prefilled quarter of 600 tokens of text the
target writes. onnxruntime by default (2 threads).

    .venv/bin/python research/scripts/step_rows.py runs/exports/smol-hf-fp16 [--backend executorch] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hyflash.export.validate import step_rows_agree
from hyflash.runtime_py.loop import Runtime
from hyflash.runtime_py.manifest import verify_graph
from hyflash.runtime_py.profile import profile_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--backend", default="onnxruntime")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rt = Runtime(args.export, args.backend, threads=2)
    tokens = profile_prompt(rt, 600)
    result = {"export": str(args.export), "backend": args.backend, "steps": {}}
    for step in ("target_decode", verify_graph(2)):
        rt.contract.step_graph = step  # the loop's single-token step, as target.step_rows 1 or 2 sets it
        checks = step_rows_agree(rt, tokens, places=6)
        result["steps"][step] = {c.graph: {"max_abs_logit_diff": c.max_diff, "rows": c.count} for c in checks}
        print(step, {g: r["max_abs_logit_diff"] for g, r in result["steps"][step].items()}, flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
