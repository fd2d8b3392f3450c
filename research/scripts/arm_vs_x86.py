"""The ARM64 runner under qemu against the x86-64 runner on the same .pte exports: greedy tokens, speculative and
target-only, on emulated CPUs without and with the dot-product extension. Where the two part: the token index
and the x86 Python runtime's top-2 logit gap there (ExecuTorch backend, the target read teacher-forced on the
common prefix). Run after `make runner runner-arm64` on exports of the reference pair.

Usage: .venv/bin/python research/scripts/arm_vs_x86.py EXPORT [EXPORT ...] > research/results/arm_vs_x86.json
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
X86 = ROOT / "build" / "runtime_cpp" / "hyflash-run"
ARM = ROOT / "build" / "arm64" / "armv8-a" / "hyflash-run"
CPUS = ("cortex-a53", "cortex-a76")


def tokens(cmd: list[str]) -> list[int]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(out.stdout.splitlines()[-1])["tokens"]


def gap_at(folder: Path, prompt: list[int], output: list[int], i: int) -> float:
    """The x86 target's top-2 logit gap before output token i (teacher-forced: prompt + output[:i])."""
    from hyflash.runtime_py.loop import Runtime, Stats

    rt = Runtime(folder, "executorch")
    logits = rt.prefill(prompt + output[:i], False, Stats())
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def main(folders: list[str]) -> dict:
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 4000, 40).tolist() for _ in range(3)]
    rows = []
    for folder in map(Path, folders):
        for prompt in prompts:
            for mode in ("speculative", "target-only"):
                flags = ["--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "32", "--ignore-eos", "--json"]
                flags += ["--no-draft"] if mode == "target-only" else []
                x86 = tokens([str(X86), str(folder), *flags])
                for cpu in CPUS:
                    arm = tokens(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, str(ARM), str(folder),
                                  *flags])
                    part = next((i for i, (a, b) in enumerate(zip(arm, x86)) if a != b), None)
                    row = {"export": folder.name, "mode": mode, "cpu": cpu, "prompt_len": len(prompt),
                           "tokens": len(x86), "equal": arm == x86, "first_difference": part}
                    if part is not None:
                        row["x86_top2_logit_gap"] = gap_at(folder, prompt, x86, part)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "host": "x86-64 (AMD EPYC)", "emulator": "qemu-user",
            "rows": rows, "equal": sum(r["equal"] for r in rows), "runs": len(rows)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
