"""An export at a real model's geometry, measured on this machine. A checkpoint with the preset's
exact geometry and random weights (no download: random weights cost what real ones do) is exported in both
formats with the shipping recipe (int4 target, int4 drafter, int4 vocabulary tables, a random HyFlash
drafter) and profiled on both backends. Reported: export wall time and peak RSS (the export's largest
process, and its processes summed, sampled every 0.25 s: a large target's .pte is lowered in a process of its
own), file
sizes by format, per-graph ms at each committed length, the drafter's share of a round, and the speedup the
loop would reach from those graph times, tau x decode / (verify + drafter), at the paper's tau (3.79,
HyFlash on Phi-4-reasoning) and at the embedded pair's (research/reference/bench.json, pooled over buckets).
Run it on an otherwise idle machine.

    .venv/bin/python scripts/real_geometry.py qwen3-0.6b [--contexts 1024,3072] [--max-context 4096]
        [--export-only] [--formats both] [--reuse-export --backends onnxruntime] [--out runs/real_geometry_qwen3-0.6b.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from hyflash.models.presets import PRESETS, write_random_checkpoint

ROOT = Path(__file__).resolve().parents[1]
HYFLASH = [sys.executable, "-m", "hyflash.cli"]
PAPER_TAU = 3.79
RECIPE = ["--drafter", "random", "--quantize", "int4", "--quantize-target", "int4", "--quantize-embeddings", "int4"]


def embedded_tau() -> float:
    """The embedded HyFlash drafter's tau in the README bench, pooled over its buckets (its row is named after
    its export folder: `hyflash`, or `v2-hyflash` since the second generation)."""
    rows = json.loads((ROOT / "research/reference/bench.json").read_text())["results"]
    taus = [r["acceptance_length"] for r in rows if r["drafter"] in ("hyflash", "v2-hyflash")]
    if not taus:
        raise SystemExit("research/reference/bench.json has no row for the embedded HyFlash drafter")
    return statistics.mean(taus)


def run_json(args: list[str]) -> dict:
    out = subprocess.run(HYFLASH + args + ["--json"], capture_output=True, text=True)
    return parsed(args, out.returncode, out.stdout, out.stderr)


def parsed(args: list[str], code: int, stdout: str, stderr: str) -> dict:
    """A hyflash command's --json output; its last error line (and exit) when it failed."""
    if code:
        sys.exit(f"hyflash {args[0]}: {(stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(stdout)


def tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            rss[int(d.name)] = int((d / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):  # the process ended while being read
            continue
        children.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def run_json_sampled(args: list[str], every_s: float = 0.25) -> tuple[dict, int]:
    """run_json, and the peak of the command's resident bytes summed over its process tree (the export
    lowers a large target's .pte in a process of its own)."""
    proc = subprocess.Popen(HYFLASH + args + ["--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    return parsed(args, proc.returncode, stdout, stderr), peak[0]


def sizes(files: dict[str, int]) -> dict[str, int]:
    """Bytes by format: the ONNX folder (graphs + weights) and the .pte program (target and drafter in one)."""
    onnx = sum(n for f, n in files.items() if f.startswith("onnx/"))
    return {"onnx": onnx, "pte": sum(n for f, n in files.items() if f.endswith(".pte"))}


def loop_speedup(ms: dict, tau: float) -> float:
    drafter = sum(ms.get(g, 0.0) for g in ("draft_read", "state_commit", "window_shift"))
    return tau * ms["target_decode"] / (ms["target_verify"] + drafter)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", choices=list(PRESETS))
    ap.add_argument("--contexts", default="1024,3072")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--formats", choices=["onnx", "pte", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the preset (a quick dry run)")
    ap.add_argument("--backends", default=None, help="profile only these (default: the exported formats')")
    ap.add_argument("--reuse-export", action="store_true",
                    help="profile the existing export again, keeping the export figures of the previous results")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "real")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    name = a.preset + (f"-{a.layers}layers" if a.layers else "")
    ckpt = write_random_checkpoint(a.preset, a.work / name / "checkpoint", layers=a.layers)
    export = a.work / name / "export"
    result = a.out or ROOT / "results" / f"real_geometry_{name}.json"
    previous = json.loads(result.read_text()) if result.is_file() else {}
    report = {"preset": a.preset, "geometry": PRESETS[a.preset], "recipe": RECIPE, "max_context": a.max_context}
    if a.reuse_export:
        if "export" not in previous or not (export / "manifest.json").is_file():
            sys.exit(f"--reuse-export: no earlier export and results for {name} ({result}); run without it first")
        report["export"] = previous["export"]
    else:
        start = time.perf_counter()
        made, tree_peak = run_json_sampled(["export", "--target", str(ckpt), "--out", str(export), "--format",
                                            a.formats, "--max-context", str(a.max_context), "--force", *RECIPE])
        report["export"] = {"wall_s": time.perf_counter() - start, "peak_rss_bytes": made["peak_rss_bytes"],
                            "peak_rss_tree_bytes": tree_peak, "files": made["bytes"],
                            "bytes_by_format": sizes(made["bytes"])}
    if not a.export_only:
        taus = {"paper": PAPER_TAU, "embedded_pair": embedded_tau()}
        backends = {"onnx": ["onnxruntime"], "pte": ["executorch"], "both": ["onnxruntime", "executorch"]}[a.formats]
        backends = a.backends.split(",") if a.backends else backends
        report["profile"] = dict(previous.get("profile", {})) if a.reuse_export else {}
        for backend in backends:
            prof = run_json(["profile", str(export), "--backend", backend, "--contexts", a.contexts,
                             "--repeats", str(a.repeats), "--no-optimum"])
            for row in prof["rows"]:
                ms = row["graph_ms"]
                row["drafter_share"] = row["drafter_ms_per_round"] / (row["drafter_ms_per_round"] + ms["target_verify"])
                row["loop_speedup"] = {k: loop_speedup(ms, t) for k, t in taus.items()}
            report["profile"][backend] = prof
        report["tau"] = taus
    report["layers"] = a.layers or PRESETS[a.preset]["num_hidden_layers"]
    result.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))


def table(r: dict) -> str:
    mib = lambda n: f"{n / 2**20:,.0f} MiB"
    e = r["export"]
    together = f" ({e['peak_rss_tree_bytes'] / 2**30:.1f} GiB its processes together)" if "peak_rss_tree_bytes" in e else ""
    lines = [f"{r['preset']}: export {e['wall_s'] / 60:.1f} min, peak RSS {e['peak_rss_bytes'] / 2**30:.1f} GiB{together}; "
             f"ONNX {mib(e['bytes_by_format']['onnx'])}, .pte {mib(e['bytes_by_format']['pte'])}"]
    if "profile" in r:
        lines.append("| backend, committed | decode ms | verify ms | draft_read ms | drafter ms a round | drafter share "
                     f"| speedup at tau {r['tau']['paper']:.2f} | at tau {r['tau']['embedded_pair']:.2f} |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for backend, prof in r["profile"].items():
            for row in prof["rows"]:
                ms = row["graph_ms"]
                lines.append(f"| {backend}, {row['context']:,} | {ms['target_decode']:.1f} | {ms['target_verify']:.1f} | "
                             f"{ms['draft_read']:.1f} | {row['drafter_ms_per_round']:.1f} | {row['drafter_share']:.0%} | "
                             f"{row['loop_speedup']['paper']:.2f}x | {row['loop_speedup']['embedded_pair']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
