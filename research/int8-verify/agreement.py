"""Teacher-forced agreement of SmolLM2-135M's int4 exports with its fp32 export, on the model's own chat text.

`hyflash validate` measures agreement on text the eager target samples; this reads 16 greedy conversations
the target wrote itself (data/chat/smollm2-regen, shard 0) through each export's prefill graph and counts the
answer positions where the export's argmax is the fp32 export's, and the fp32 logit gap (top logit minus the
logit of the quantized export's choice) where they part. A `.pte` export is run on ExecuTorch, an ONNX one on
onnxruntime. Raw JSON to results/agreement.json, or --out.

    .venv/bin/python research/int8-verify/agreement.py runs/exports/smol-hf-fp32 runs/exports/smol-hf-int4 ...
    .venv/bin/python research/int8-verify/agreement.py runs/exports/smol-hf-fp32 runs/exports/smol-pte-int4 \
        --out research/int8-verify/results/agreement_pte.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def logits_of(rt, tokens: list[int]) -> np.ndarray:
    rt.cache.reset()
    out, pos = [], 0
    while pos < len(tokens):
        n = min(rt.chunk, len(tokens) - pos)
        logits, _ = rt.run_target("target_prefill", tokens[pos:pos + n], pos)
        out.append(logits[:n].copy())
        rt.cache.commit(pos, n)
        pos += n
    return np.concatenate(out)


def backend(folder: Path) -> str:
    return "onnxruntime" if (folder / "onnx").is_dir() else "executorch"


def main() -> None:
    from hyflash.runtime_py.loop import Runtime

    args = sys.argv[1:]
    dest = Path(__file__).parent / "results/agreement.json"
    if "--out" in args:
        at = args.index("--out")
        dest = Path(args[at + 1])
        del args[at:at + 2]
    folders = [Path(a) for a in args]
    with np.load(ROOT / "data/chat/smollm2-regen/shard-00000.npz") as z:
        rows = [b for b in range(len(z["length"])) if z["greedy"][b]][:16]
        texts = [(z["tokens"][b, :z["length"][b]].tolist(), z["answer"][b, :z["length"][b]]) for b in rows]
    reference = Runtime(folders[0], backend(folders[0]), threads=2)
    ref = [logits_of(reference, t) for t, _ in texts]
    result = {"reference": folders[0].name, "conversations": len(texts), "exports": {}}
    for folder in folders[1:]:
        rt = Runtime(folder, backend(folder), threads=2)
        agree = total = 0
        gaps = []
        for (tokens, answer), r in zip(texts, ref):
            got = logits_of(rt, tokens)
            where = np.flatnonzero(answer[1:]) # position i predicts token i + 1: answer positions
            a, b = r[where].argmax(-1), got[where].argmax(-1)
            agree += int((a == b).sum())
            total += len(where)
            gaps += (r[where, a] - r[where, b])[a != b].tolist()
        result["exports"][folder.name] = {"agreement": agree / total, "positions": total,
                                          "flip_gap_median": float(np.median(gaps)) if gaps else 0.0,
                                          "flip_gap_max": float(max(gaps)) if gaps else 0.0}
        print(folder.name, result["exports"][folder.name], flush=True)
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
