"""What a build of the .pte cache kernels and a program's verify form cost, side by side: `hyflash profile`
(ExecuTorch backend) on each RUN in turn, for several alternating rounds, each in its own process with
HYFLASH_KERNELS_LIB naming the kernels library (a loaded library stays registered: one per process). With
--runner, `hyflash-run EXPORT --profile` instead, the library found first on LD_LIBRARY_PATH (the runner's
RUNPATH names this checkout's build after it).

A RUN is LABEL=EXPORT[@LIB]; LIB is a built libhyflash_kernels.so, or commit:SHA to build the one of that commit
(its runtime_cpp/ in a temporary worktree, the kernels target only); no @LIB: this checkout's (`make runner`).

Usage (idle machine):
  .venv/bin/python research/scripts/kernels_ab.py \
      before=runs/exports/smol-pte-int4-rows@commit:be7be93 rows=runs/exports/smol-pte-int4-rows \
      block=runs/exports/smol-pte-int4 --rounds 2 --out research/smollm2-drafter/results/kernels_ab.json
  .venv/bin/python research/scripts/kernels_ab.py before=runs/exports/smol-pte-int4@commit:eb2839b \
      after=runs/exports/smol-pte-int4 --runner --rounds 5 --out research/pte-kernels/results/kernels_ab_runner.json
"""

import argparse
import json
import os
import shutil
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


def profile_runner(export: str, lib: Path | None, a) -> dict:
    """hyflash-run's ms by graph (profile()'s names) at each committed length, `lib` loaded in place of its own."""
    env = dict(os.environ)
    if lib:
        env["LD_LIBRARY_PATH"] = str(lib.parent)
    out = subprocess.run([str(ROOT / "build" / "runtime_cpp" / "hyflash-run"), export, "--profile", "--contexts",
                          a.contexts, "--repeat", str(a.repeats), "--threads", str(a.threads), "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"hyflash-run {export}: {out.stderr.strip().splitlines()[-1]}")
    return {p["committed"]: {"target_decode": p["verify_ms"]["1"], "target_verify": p["verify_ms"]["8"],
                             **{f"target_verify_{w}": ms for w, ms in p["verify_ms"].items() if w not in ("1", "8")},
                             "draft_read": p["draft_read_ms"], "commit": p["commit_ms"]}
            for p in json.loads(out.stdout)["points"]}


def profile(export: str, lib: Path | None, a) -> dict:
    if a.runner:
        return profile_runner(export, lib, a)
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
    ap.add_argument("--runner", action="store_true", help="time hyflash-run's calls instead of the Python runtime's")
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
            elif lib and a.runner and Path(lib).name != "libhyflash_kernels.so":  # the name the runner links
                (Path(tmp) / label).mkdir()
                lib = Path(shutil.copy(lib, Path(tmp) / label / "libhyflash_kernels.so"))
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
                                       **({"verify4_ms": med["target_verify_4"]} if "target_verify_4" in med else {}),
                                       **({"prefill_ms": med["target_prefill"]} if "target_prefill" in med else {})}
    command = ("research/scripts/kernels_ab.py " + " ".join(a.runs) + f" --rounds {a.rounds} --repeats {a.repeats}"
               + " --runner" * a.runner)
    a.out.write_text(json.dumps({"command": command, "threads": a.threads, "summary": summary, "runs": found},
                                indent=1) + "\n")
    for label, rows in summary.items():
        for context, s in rows.items():
            print(f"{label:>10} {context:>6}: decode {s['decode_ms']:6.2f} ms, verify8 {s['verify8_ms']:6.2f} ms "
                  f"({s['verify8_in_decode_steps']:.2f} steps)"
                  + (f", verify4 {s['verify4_ms']:6.2f} ms" if "verify4_ms" in s else "")
                  + (f", prefill {s['prefill_ms']:7.1f} ms" if "prefill_ms" in s else ""))


if __name__ == "__main__":
    main()
