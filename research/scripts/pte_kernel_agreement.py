"""Which kernels make the native runner and the Python runtime part on a quantized .pte: target-only greedy answers
to the held-out chat set's first turns from the Python runtime (ExecuTorch backend: the wheel's LLM kernels),
`hyflash-run` (runtime_cpp's kernels) and `hyflash-run-a` (the wheel's kernel library linked in:
research/scripts/runner_option_a.sh). If runner-a agrees with Python where hyflash-run does not, the kernels
are the difference.

Usage: .venv/bin/python research/scripts/pte_kernel_agreement.py EXPORT [--prompts 13] [--max-new-tokens 64]
  > research/results/pte_kernel_agreement.json
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = {"hyflash-run": ROOT / "build" / "runtime_cpp" / "hyflash-run",
           "hyflash-run-a": ROOT / "build" / "runtime_cpp_a" / "hyflash-run-a"}


def native(runner: Path, folder: Path, prompt: list[int], max_new: int) -> list[int]:
    out = subprocess.run([str(runner), str(folder), "--prompt-ids", ",".join(map(str, prompt)), "--no-draft",
                          "--max-new-tokens", str(max_new), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])["tokens"]


def main() -> dict:
    from hyflash.models.chat import Transcript
    from hyflash.models.generation import load_tokenizer
    from hyflash.runtime_py.chatbench import read_chats
    from hyflash.runtime_py.loop import GenerationConfig, Runtime

    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("--prompts", type=int, default=13)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    tok = load_tokenizer(a.export)
    chats = read_chats(ROOT / "data" / "chat" / "heldout.jsonl")[::5][:a.prompts]  # every category
    runtime = Runtime(a.export, "executorch")
    rows = []
    for chat in chats:
        prompt, _ = Transcript(tok).prompt(chat["turns"][0])
        py = [t for new in runtime.generate(prompt, GenerationConfig(max_new_tokens=a.max_new_tokens, draft="none"))
              for t in new]
        row = {"category": chat["category"], "prompt_tokens": len(prompt), "python_tokens": len(py)}
        for name, path in RUNNERS.items():
            got = native(path, a.export, prompt, a.max_new_tokens)
            row[name] = {"equal": got == py,
                         "first_difference": next((i for i, (x, y) in enumerate(zip(got, py)) if x != y), None)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "export": a.export.name, "max_new_tokens": a.max_new_tokens,
            "rows": rows, **{f"{n}_equal": sum(r[n]["equal"] for r in rows) for n in RUNNERS}, "prompts": len(rows)}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
