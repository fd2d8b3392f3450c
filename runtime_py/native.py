"""The native runner (`hyflash-run`, runtime_cpp/) driven from Python: one generation per call, or one
conversation's turns per call, its JSON read back. For cross-runtime checks (`hyflash validate`) and
benchmarks that put the runner beside the Python runtime."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from hyflash.runtime_py.ptekernels import BUILD


def runner_path() -> Path:
    """$HYFLASH_RUN, else the one `make runner` builds in this checkout."""
    if os.environ.get("HYFLASH_RUN"):
        return Path(os.environ["HYFLASH_RUN"])
    return BUILD / "hyflash-run"


def run_native(folder: Path, prompt: list[int], max_new_tokens: int, draft: str = "model",
               threads: int | None = None, runner: Path | None = None, ignore_eos: bool = False,
               kernels: str = "hyflash", width: str | int = "full") -> dict:
    """One greedy generation by hyflash-run, built with `kernels` (the project's by default), drafting by `draft`
    (model, prompt-lookup or none), verifying `width` rows a round (full: 8; a verify width; rule: the width
    rule on the export's costs, hyflash-run's own costs-hyflash-run.json, else costs-executorch.json): its JSON
    (tokens, rounds, tokens_per_s, pte_kernels, threads, ...). A refusal (a runner built with other kernels among
    them) or a crash: ValueError with the runner's first line."""
    cmd = _command(folder, max_new_tokens, draft, threads, runner, ignore_eos, kernels, width)
    return _runs(folder, subprocess.run(cmd + ["--prompt-ids", ",".join(map(str, prompt))], capture_output=True,
                                        text=True))[-1]


def run_conversation(folder: Path, prompts: list[list[int]], max_new_tokens: int, draft: str = "model",
                     threads: int | None = None, runner: Path | None = None, ignore_eos: bool = False,
                     kernels: str = "hyflash", width: str | int = "full") -> list[dict]:
    """A conversation's turns answered by one hyflash-run (`--conversation`), which keeps its context between
    them as an app does: `prompts[t]` is the whole conversation up to turn t's reply (the ids the chat template
    renders), and what the runner already holds of it is not prefilled again. One JSON per turn, as run_native's."""
    cmd = _command(folder, max_new_tokens, draft, threads, runner, ignore_eos, kernels, width)
    lines = "".join(",".join(map(str, p)) + "\n" for p in prompts)
    return _runs(folder, subprocess.run(cmd + ["--conversation"], input=lines, capture_output=True, text=True))


def _command(folder, max_new_tokens, draft, threads, runner, ignore_eos, kernels, width) -> list[str]:
    runner = runner or runner_path()
    if not runner.is_file():
        raise FileNotFoundError(f"{runner}: no hyflash-run; build it with `make runner` (or set HYFLASH_RUN)")
    cmd = [str(runner), str(folder), "--max-new-tokens", str(max_new_tokens), "--pte-kernels", kernels, "--json"]
    cmd += ["--draft", draft] + (["--ignore-eos"] if ignore_eos else [])
    cmd += ["--threads", str(threads)] if threads else []
    cmd += ["--width", str(width)] if draft != "none" and width != "full" else []
    return cmd


def _runs(folder: Path, out: subprocess.CompletedProcess) -> list[dict]:
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]
        raise ValueError(f"hyflash-run failed on {folder}: {first}")
    return [json.loads(line) for line in out.stdout.splitlines()]
