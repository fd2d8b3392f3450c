"""The long run: speculative generation until an export's usable context is full.

Checks, round by round, what an on-device app relies on over a long session: the drafter's
context keeps the same buffers' shapes and bytes (it never grows with the text), nothing in it turns
NaN, the output is token-identical to target-only decoding, and the process's peak memory grows
by no more than the target's preallocated K/V cache as its pages get written (measured from the
first round on, once every graph has run and the sessions hold their working memory).

    python -m hyflash.longrun EXPORT_DIR [--backend onnxruntime|executorch] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from hyflash.demo import PROMPT
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def peak_rss() -> int:
    """Bytes: the process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def long_run(folder: str | Path, prompt: list[int], backend: str = "onnxruntime", threads: int | None = None) -> dict:
    runtime = Runtime(folder, backend, threads)
    rss_loaded = peak_rss()
    buffers = {name: (buf.shape, buf.nbytes) for name, buf in runtime.ctx.current.items()}
    cfg = GenerationConfig(max_new_tokens=runtime.max_context, ignore_eos=True)  # runs to the usable context
    spec, rounds_checked, nonfinite = Stats(), 0, []
    t = time.perf_counter()
    for _ in runtime.generate(prompt, cfg, spec):
        if rounds_checked == 1:  # after the first round every graph has run: the sessions' buffers are in place
            rss_start = peak_rss()
        now = {name: (buf.shape, buf.nbytes) for name, buf in runtime.ctx.current.items()}
        if now != buffers:
            raise AssertionError(f"the drafter's context changed size after {len(spec.tokens)} tokens: {now}")
        nonfinite += [name for name, buf in runtime.ctx.current.items() if buf.dtype.kind == "f" and not np.isfinite(buf).all()]
        rounds_checked += 1
    spec_s = time.perf_counter() - t
    rss_end = peak_rss()
    base = Stats()
    t = time.perf_counter()
    for _ in runtime.generate(prompt, GenerationConfig(max_new_tokens=runtime.max_context, ignore_eos=True,
                                                       draft="none"), base):
        pass
    base_s = time.perf_counter() - t
    first_diff = next((i for i, (a, b) in enumerate(zip(spec.tokens, base.tokens)) if a != b), None)
    return {
        "backend": backend, "prompt_tokens": len(prompt), "generated_tokens": len(spec.tokens),
        "final_context": len(prompt) + len(spec.tokens), "usable_context": runtime.usable_context,
        "stop_reason": spec.stop_reason, "identical_to_target_only": spec.tokens == base.tokens,
        "first_difference": first_diff, "nonfinite_buffers": sorted(set(nonfinite)),
        "rounds": spec.rounds, "acceptance_length": spec.acceptance_length, "rounds_checked": rounds_checked,
        "speculative_s": spec_s, "target_only_s": base_s,
        "drafter_context_bytes": runtime.context_bytes(0)["allocated"],
        "target_kv_bytes": runtime.context_bytes(0)["target_kv_allocated"],
        "peak_rss_loaded": rss_loaded, "peak_rss_start": rss_start, "peak_rss_end": rss_end, "peak_rss_growth": rss_end - rss_start,
    }


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    p = argparse.ArgumentParser(prog="python -m hyflash.longrun", description=__doc__.splitlines()[0])
    p.add_argument("artifacts", type=Path)
    p.add_argument("--backend", choices=["onnxruntime", "executorch"], default="onnxruntime")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    prompt = Tokenizer.from_file(str(args.artifacts / "tokenizer.json")).encode(PROMPT).ids
    r = long_run(args.artifacts, prompt, args.backend, args.threads)
    if args.json:
        print(json.dumps(r))
    else:
        mib = 2 ** 20
        print(f"{r['generated_tokens']} tokens after a {r['prompt_tokens']}-token prompt, to context "
              f"{r['final_context']} ({r['stop_reason']}); identical to target-only: {r['identical_to_target_only']}; "
              f"non-finite buffers: {r['nonfinite_buffers'] or 'none'}\n"
              f"tau {r['acceptance_length']:.2f} over {r['rounds']} rounds; speculative {r['speculative_s']:.1f} s, "
              f"target-only {r['target_only_s']:.1f} s\n"
              f"drafter context {r['drafter_context_bytes'] / mib:.2f} MiB, the same size in all "
              f"{r['rounds_checked']} checks; target KV {r['target_kv_bytes'] / mib:.1f} MiB\n"
              f"peak RSS {r['peak_rss_loaded'] / mib:.0f} MiB loaded, {r['peak_rss_start'] / mib:.0f} MiB after the "
              f"first round, {r['peak_rss_end'] / mib:.0f} MiB at the end "
              f"(+{r['peak_rss_growth'] / mib:.1f} MiB)")
    ok = r["identical_to_target_only"] and not r["nonfinite_buffers"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
