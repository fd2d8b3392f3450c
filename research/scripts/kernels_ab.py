"""What a build of the .pte cache kernels and a program's verify form cost, side by side: `hyflash profile`
(ExecuTorch backend) on each RUN in turn, for several alternating rounds, each in its own process with
HYFLASH_KERNELS_LIB naming the kernels library (a loaded library stays registered: one per process).

A RUN is LABEL=EXPORT[@LIB]; LIB is a built libhyflash_kernels.so, or commit:SHA to build the one of that commit
(its runtime_cpp/ in a temporary worktree, the kernels target only); no @LIB: this checkout's (`make runner`).

Usage (idle machine):
  .venv/bin/python research/scripts/kernels_ab.py \
      before=runs/exports/smol-pte-int4-rows@commit:be7be93 rows=runs/exports/smol-pte-int4-rows \
      block=runs/exports/smol-pte-int4 --rounds 2 --out research/smollm2-drafter/results/kernels_ab.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_at(commit: str, into: Path) -> Path:
    """libhyflash_kernels.so as `commit` builds it."""
    import executorch

    tree = into / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), commit], check=True)
    try:
        subprocess.run(["cmake", "-S", str(tree / "runtime_cpp"), "-B", str(into / "build"),
                        f"-DEXECUTORCH_ROOT={list(executorch.__path__)[0]}"], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", str(into / "build"), "--target", "hyflash_kernels", "-j2"], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    return into / "build" / "libhyflash_kernels.so"


def profile(export: str, lib: Path | None, a) -> dict:
    env = {**os.environ, **({"HYFLASH_KERNELS_LIB": str(lib)} if lib else {})}
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "hyflash"), "profile", export, "--backend", "executorch",
                          "--contexts", a.contexts, "--repeats", str(a.repeats), "--new-tokens", "16", "--threads",
                          str(a.threads), "--no-optimum", "--json"], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"profile {export}: {out.stderr.strip().splitlines()[-1]}")
    report = json.loads(out.stdout)
    return {row["context"]: row["graph_ms"] for row in report["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="LABEL=EXPORT[@LIB]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs, built = [], {}
        for spec in a.runs:
            label, _, rest = spec.partition("=")
            export, _, lib = rest.partition("@")
            if lib.startswith("commit:"):
                sha = lib.removeprefix("commit:")
                built.setdefault(sha, build_at(sha, Path(tmp) / sha))
                lib = built[sha]
            runs.append((label, export, Path(lib) if lib else None, spec))
        found = []
        for r in range(1, a.rounds + 1):
            for label, export, lib, spec in runs:
                print(f"round {r}: {label}", file=sys.stderr, flush=True)
                found.append({"round": r, "run": label, "spec": spec, "graph_ms": profile(export, lib, a)})
    summary = {}
    for label, *_ in runs:
        mine = [f["graph_ms"] for f in found if f["run"] == label]
        summary[label] = {}
        for context in mine[0]:
            med = {g: statistics.median(m[context][g] for m in mine) for g in mine[0][context]}
            summary[label][context] = {"decode_ms": med["target_decode"], "verify8_ms": med["target_verify"],
                                       "verify8_in_decode_steps": med["target_verify"] / med["target_decode"],
                                       "prefill_ms": med["target_prefill"]}
    command = "research/scripts/kernels_ab.py " + " ".join(a.runs) + f" --rounds {a.rounds} --repeats {a.repeats}"
    a.out.write_text(json.dumps({"command": command, "threads": a.threads, "summary": summary, "runs": found},
                                indent=1) + "\n")
    for label, rows in summary.items():
        for context, s in rows.items():
            print(f"{label:>10} {context:>6}: decode {s['decode_ms']:6.2f} ms, verify8 {s['verify8_ms']:6.2f} ms "
                  f"({s['verify8_in_decode_steps']:.2f} steps), prefill {s['prefill_ms']:7.1f} ms")


if __name__ == "__main__":
    main()
