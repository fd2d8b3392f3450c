"""Issue 17: the embedded pair exported in fp16 (`--dtype fp16`, both formats), validated on both backends
against the fp32 eager models, and its greedy speculative output compared token by token with the fp32
target's own greedy output (PyTorch, eager) on the bench prompts: held-out files, buckets 256 / 512 / 1,024
/ 2,048, 8 prompts a bucket, 64 tokens.

    .venv/bin/python research/scripts/fp16_report.py [--export runs/exports/fp16] [--reuse-export]
        [--prompts-per-bucket 8] [--out research/results/fp16.json]

Per backend: `identical` is the share of prompts whose 64 tokens equal the fp32 target's, `agreement`
the share of tokens equal at the same position, `prefix` the share generated before the first
difference. A flip near a tie changes every token after it, so these count one flip many times;
`teacher_forced` counts each token once: the fp32 target reads the fp16 loop's own output, and a token
agrees when it is the fp32 target's argmax after that same prefix. `tie_margins` are the fp32 logit
gaps (top-1 minus the fp16 loop's token) where they disagree: near-ties when they are small next to the
backend's fp16 logit error in `validate`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from hyflash.export.pipeline import ExportConfig, export
from hyflash.export.validate import summarize, validate
from hyflash.models.loading import load_target, resolve
from hyflash.models.target import greedy
from hyflash.runtime_py.bench import BenchConfig, export_tokenizer, make_prompts, run_once, source_texts
from hyflash.runtime_py.loop import Runtime

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=ROOT / "runs" / "exports" / "fp16")
    ap.add_argument("--reuse-export", action="store_true")
    ap.add_argument("--prompts-per-bucket", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "fp16.json")
    a = ap.parse_args()

    report = {"export": str(a.export)}
    if not a.reuse_export:
        start = time.perf_counter()
        export(ExportConfig(target=resolve("reference", "target"), drafter="reference", out=a.export, dtype="fp16",
                            force=True))
        report["export_s"] = time.perf_counter() - start
    rows = summarize(validate(a.export))
    report["validate"] = [{"graph": r.graph, "output": r.output, "backend": r.backend, "max_diff": r.max_diff,
                           "tolerance": r.tolerance, "scale": r.scale, "ok": r.ok} for r in rows]
    report["validate_ok"] = all(r.ok for r in rows)

    runtimes = {b: Runtime(a.export, b) for b in ("onnxruntime", "executorch")}
    cfg = BenchConfig(artifacts=(a.export,), prompts_per_bucket=a.prompts_per_bucket, max_new_tokens=a.max_new_tokens)
    rt = runtimes["onnxruntime"]
    prompts = make_prompts(export_tokenizer(rt), source_texts(None), cfg, rt.max_context)
    target = load_target(resolve("reference", "target"))
    runs = []
    todo = [(b, p) for b, ps in prompts.items() for p in ps]
    for bucket, prompt in tqdm(todo, desc="fp16 vs fp32", dynamic_ncols=True):
        reference = greedy(target, prompt, a.max_new_tokens, rt.max_context)
        row = {"bucket": list(bucket), "prompt_tokens": len(prompt), "fp32": reference}
        for backend, runtime in runtimes.items():
            row[backend] = run_once(runtime, prompt, "model", a.max_new_tokens).tokens
            row[f"{backend}_tie_margins"] = tie_margins(target, prompt, row[backend])
        runs.append(row)
    report["runs"] = runs
    report["agreement"] = {b: agreement(runs, b) for b in runtimes}
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"validate_ok": report["validate_ok"], "agreement": report["agreement"]}, indent=1))


@torch.no_grad()
def tie_margins(target, prompt: list[int], tokens: list[int]) -> list[float]:
    """The fp32 target reads prompt + tokens once; for each token that is not its argmax after the same
    prefix, the gap between its top logit and that token's logit."""
    logits, _ = target(torch.tensor([prompt + tokens[:-1]]))
    logits = logits[0, len(prompt) - 1:]
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    gaps = logits.max(dim=-1).values - chosen
    return [round(g, 5) for g in gaps[logits.argmax(dim=-1) != torch.tensor(tokens)].tolist()]


def agreement(runs: list[dict], backend: str) -> dict:
    same = total = prefix = identical = 0
    margins = [m for r in runs for m in r[f"{backend}_tie_margins"]]
    for r in runs:
        ref, got = r["fp32"], r[backend]
        n = len(ref)
        same += sum(x == y for x, y in zip(ref, got))
        first = next((i for i, (x, y) in enumerate(zip(ref, got)) if x != y), n)
        prefix += first
        identical += first == n and len(got) == n
        total += n
    return {"prompts": len(runs), "tokens": total, "identical": identical / len(runs), "agreement": same / total,
            "prefix": prefix / total, "mismatch_rate": 1 - same / total,
            "teacher_forced": 1 - len(margins) / sum(len(r[backend]) for r in runs), "tie_margins": sorted(margins)}


if __name__ == "__main__":
    main()
