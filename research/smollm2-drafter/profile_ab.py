"""Two exports' per-call costs, profiled in turn (A, B, A, B, ...) in one sitting so a change of the machine's
pace falls on both: `hyflash-run EXPORT --profile` (`--runner`) or `hyflash profile EXPORT` (onnxruntime or
ExecuTorch through Python), 256 and 1,024 committed tokens, 2 threads. Writes every run's JSON and the medians.

    .venv/bin/python research/smollm2-drafter/profile_ab.py A B --runner --rounds 3 --out results/X.json
    .venv/bin/python research/smollm2-drafter/profile_ab.py A B --backend onnxruntime --rounds 3 --out results/X.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

RUNNER = "build/runtime_cpp/hyflash-run"
CONTEXTS = "256,1024"


def profile(export: Path, runner: bool, backend: str) -> dict[str, dict[str, float]]:
    """ms per call by graph, keyed by committed length."""
    if runner:
        out = subprocess.run([RUNNER, str(export), "--profile", "--contexts", CONTEXTS, "--repeat", "25",
                              "--threads", "2", "--json"], check=True, capture_output=True, text=True).stdout
        return {str(p["committed"]): {**{f"verify_{w}": ms for w, ms in p["verify_ms"].items()},
                                      "draft_read": p["draft_read_ms"], "commit": p["commit_ms"]}
                for p in json.loads(out)["points"]}
    out = subprocess.run([".venv/bin/hyflash", "profile", str(export), "--backend", backend, "--contexts", CONTEXTS,
                          "--repeats", "30", "--new-tokens", "16", "--threads", "2", "--no-optimum", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return {str(r["context"]): r["graph_ms"] for r in json.loads(out)["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs=2, type=Path)
    ap.add_argument("--runner", action="store_true", help="time hyflash-run's calls (.pte exports)")
    ap.add_argument("--backend", default="executorch", help="without --runner: hyflash profile's backend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = {str(e): [] for e in args.exports}
    for i in range(args.rounds):
        for e in args.exports if i % 2 == 0 else args.exports[::-1]:  # the order turns each round
            runs[str(e)].append(profile(e, args.runner, args.backend))
            print(f"round {i + 1}: {e}", flush=True)
    medians = {e: {ctx: {g: statistics.median(r[ctx][g] for r in rs) for g in rs[0][ctx]} for ctx in rs[0]}
               for e, rs in runs.items()}
    a, b = (str(e) for e in args.exports)
    for ctx in medians[a]:
        print(f"committed {ctx}: ms per call, median of {args.rounds} runs ({a} -> {b})")
        for g in medians[a][ctx]:
            print(f"  {g:18s} {medians[a][ctx][g]:8.2f} -> {medians[b][ctx][g]:8.2f}")
    args.out.write_text(json.dumps({"runner": args.runner, "backend": "hyflash-run" if args.runner else args.backend,
                                    "threads": 2, "rounds": args.rounds, "medians": medians, "runs": runs},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
