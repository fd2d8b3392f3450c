"""hyflash-run beside the Python runtime (executorch backend) on one export, side by side in
one run: held-out prompts per bucket, each decoded by every runtime in turn (the order alternating from
prompt to prompt), with the drafter and without; the tokens must be equal. Per runtime and bucket: decode
tokens/s, prefill tokens/s, per-graph ms (means over the runs). Run it on an otherwise idle machine.

    .venv/bin/python scripts/runner_bench.py EXPORT [--runner NAME=PATH ...] [--buckets 256,1024,2048]
        [--prompts 3] [--max-new-tokens 64] [--out runs/runner_vs_python.json]

--runner defaults to cpp=build/runtime_cpp/hyflash-run (`make runner`); research/scripts/runner_option_a.sh builds
the same runner on the wheel's own kernel library (option a) for a second entry.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

from hyflash.runtime_py.bench import BenchConfig, make_prompts, run_once, source_texts
from hyflash.runtime_py.loop import Runtime


def python_run(runtime: Runtime, prompt: list[int], draft: str, max_new: int) -> dict:
    return run_once(runtime, prompt, draft, max_new).to_json()


def runner_run(path: str, folder: Path, prompt: list[int], draft: str, max_new: int) -> dict:
    cmd = [path, str(folder), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(max_new),
           "--ignore-eos", "--json"] + (["--no-draft"] if draft == "none" else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{path}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def summary(runs: list[dict]) -> dict:
    graphs = sorted({g for r in runs for g in r["graph_ms"]})
    return {"tokens_per_s": statistics.mean(r["tokens_per_s"] for r in runs),
            "prefill_tokens_per_s": statistics.mean(r["prompt_tokens"] / r["prefill_s"] for r in runs),
            "acceptance_length": statistics.mean(r["acceptance_length"] for r in runs),
            "graph_ms": {g: statistics.mean(r["graph_ms"][g] for r in runs if g in r["graph_ms"]) for g in graphs}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--runner", action="append", default=None, help="NAME=PATH of a hyflash-run binary")
    ap.add_argument("--buckets", default="256,1024,2048")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("runs/runner_vs_python.json"))
    args = ap.parse_args()
    runners = dict(r.split("=", 1) for r in (args.runner or ["cpp=build/runtime_cpp/hyflash-run"]))
    runtime = Runtime(args.export, "executorch")
    cfg = BenchConfig((args.export,), buckets=tuple(int(b) for b in args.buckets.split(",")),
                      prompts_per_bucket=args.prompts, max_new_tokens=args.max_new_tokens)
    tokenizer = Tokenizer.from_file(str(args.export / "tokenizer.json"))
    prompts = make_prompts(tokenizer, source_texts(None), cfg, runtime.usable_context)
    labels = ["python", *runners]
    report = {"export": str(args.export), "max_new_tokens": args.max_new_tokens, "runners": runners,
              "identical": True, "buckets": {}}
    for (lo, hi), group in prompts.items():
        runs = {(label, draft): [] for label in labels for draft in ("model", "none")}
        for i, prompt in enumerate(group):
            for draft in ("model", "none"):
                order = labels if i % 2 == 0 else labels[::-1]
                got = {}
                for label in order:
                    got[label] = (python_run(runtime, prompt, draft, args.max_new_tokens) if label == "python" else
                                  runner_run(runners[label], args.export, prompt, draft, args.max_new_tokens))
                    runs[label, draft].append(got[label])
                same = all(got[label]["tokens"] == got["python"]["tokens"] for label in labels)
                report["identical"] &= same
                print(f"[{lo}, {hi}) prompt {i} ({len(prompt)} tokens) {draft}: " +
                      ", ".join(f"{label} {got[label]['tokens_per_s']:.1f} tok/s" for label in labels) +
                      ("" if same else "  TOKENS DIFFER"), file=sys.stderr)
        report["buckets"][f"{lo}-{hi}"] = {f"{label}/{draft}": {**summary(r), "runs": r}
                                           for (label, draft), r in runs.items()}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{'bucket':>10} {'runtime':>16} {'tok/s':>8} {'verify ms':>10} {'decode ms':>10} {'draft_read':>10}")
    for bucket, rows in report["buckets"].items():
        for key, s in rows.items():
            ms = s["graph_ms"]
            print(f"{bucket:>10} {key:>16} {s['tokens_per_s']:8.1f} {ms.get('target_verify', 0):10.2f} "
                  f"{ms.get('target_decode', 0):10.2f} {ms.get('draft_read', 0):10.2f}")
    print(f"identical tokens: {report['identical']}; raw: {args.out}")


if __name__ == "__main__":
    main()
