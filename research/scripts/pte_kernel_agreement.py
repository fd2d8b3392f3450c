"""Which kernels make the native runner and the Python runtime part on a quantized .pte: greedy answers,
target-only and speculative, from the Python runtime (ExecuTorch backend, with the cache kernels of
--pte-kernels: ExecuTorch's own build, or the project's libhyflash_kernels.so), `hyflash-run` (the project's
kernels) and, where built, `hyflash-run-a` (ExecuTorch's kernel library linked in:
research/scripts/runner_option_a.sh). Prompts: the held-out chat set's first turns rendered by the chat
template (every category), or, for an export without one, held-out code prompts of 256-2,000 tokens. With
ExecuTorch's kernels in Python, runner-a agreeing where hyflash-run does not isolates the kernels as the
difference; with the project's, hyflash-run should agree everywhere.

Usage: .venv/bin/python research/scripts/pte_kernel_agreement.py EXPORT [--pte-kernels executorch]
  [--prompts 13] [--max-new-tokens 64] [--modes none,model] [--runners hyflash-run]
  > research/results/pte_kernel_agreement_<...>.json   (--prompts 64: every held-out conversation)
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = {"hyflash-run": ROOT / "build" / "runtime_cpp" / "hyflash-run",
           "hyflash-run-a": ROOT / "build" / "runtime_cpp_a" / "hyflash-run-a"}
KERNELS = {"hyflash-run": "hyflash", "hyflash-run-a": "executorch"}  # what each runner was built with


def main() -> dict:
    from hyflash.runtime_py import ptekernels
    from hyflash.runtime_py.loop import GenerationConfig, Runtime
    from hyflash.runtime_py.native import run_native

    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("--prompts", type=int, default=13)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--pte-kernels", choices=ptekernels.CHOICES, default="executorch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="none", help="comma-separated: none (target-only), model (speculative)")
    ap.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, of: " + ", ".join(RUNNERS))
    a = ap.parse_args()
    ptekernels.choose(a.pte_kernels)
    runners = {n: RUNNERS[n] for n in a.runners.split(",") if RUNNERS[n].is_file()}
    runtime = Runtime(a.export, "executorch", a.threads)
    rows = []
    for category, prompt in prompts(a.export, a.prompts):
        for draft in a.modes.split(","):
            cfg = GenerationConfig(max_new_tokens=a.max_new_tokens, draft=draft)
            py = [t for new in runtime.generate(prompt, cfg) for t in new]
            row = {"category": category, "draft": draft, "prompt_tokens": len(prompt), "python_tokens": len(py)}
            for name, path in runners.items():
                ran = run_native(a.export, prompt, a.max_new_tokens, draft, a.threads, path,
                                 kernels=KERNELS[name])
                got = ran["tokens"]
                row[name] = {"equal": got == py, "pte_kernels": ran.get("pte_kernels"),
                             "first_difference": next((i for i, (x, y) in enumerate(zip(got, py)) if x != y), None)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "export": a.export.name, "max_new_tokens": a.max_new_tokens,
            "python_pte_kernels": runtime.backend.kernels, "threads": a.threads, "modes": a.modes,
            "rows": rows, **{f"{n}_equal": sum(r[n]["equal"] for r in rows) for n in runners}, "runs": len(rows)}


def prompts(export: Path, n: int) -> list[tuple[str, list[int]]]:
    """(category, ids): chat first turns through the template, or held-out code prompts without one."""
    from tokenizers import Tokenizer

    from hyflash.models.chat import Transcript
    from hyflash.models.generation import load_tokenizer
    from hyflash.runtime_py.bench import BenchConfig, make_prompts, source_texts
    from hyflash.runtime_py.chatbench import read_chats
    from hyflash.runtime_py.manifest import load_manifest

    if (load_manifest(export).get("generation") or {}).get("chat_template"):
        tok = load_tokenizer(export)
        chats = read_chats(ROOT / "data" / "chat" / "heldout.jsonl")
        chats = chats if n >= len(chats) else chats[::5][:n]  # all, or a few of every category
        return [(c["category"], Transcript(tok).prompt(c["turns"][0])[0]) for c in chats]
    cfg = BenchConfig((export,), buckets=(256, 1024, 2001), prompts_per_bucket=-(-n // 2), max_new_tokens=64)
    groups = make_prompts(Tokenizer.from_file(str(export / "tokenizer.json")), source_texts(None), cfg, 2048)
    return [(f"code {lo}-{hi}", p) for (lo, hi), group in groups.items() for p in group][:n]


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
