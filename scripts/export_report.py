"""Export the reference pair (HyFlash drafter) fp32 / int8 / int4 (and int4 with an int4 target),
both formats; time each export, list the files' sizes, validate each, and write the figures as
JSON and a Markdown table.

    .venv/bin/python scripts/export_report.py [--out runs/exports] [--report runs/export.json]
        [--only export|validate] [--variants none,int8,int4,int4+target]

`--only export` records the exports (time, files) and stops; `--only validate` validates the
folders a previous run exported, keeping that run's export figures. Quantized exports are
validated twice: on text the target writes (validate's default) and on the held-out corpus.
Variants already in the report file and not run again are kept.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hyflash.export.pipeline import ExportConfig, export
from hyflash.export.validate import summarize, validate
from hyflash.models.loading import resolve
from hyflash.runtime_py.bench import source_texts

VARIANTS = {"none": ("none", "none"), "int8": ("int8", "none"), "int4": ("int4", "none"),
            "int4+target": ("int4", "int4")}  # name -> (--quantize, --quantize-target)


def sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/exports"))
    p.add_argument("--report", type=Path, default=Path("runs/export.json"))
    p.add_argument("--only", choices=("export", "validate"))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args()
    target, drafter = resolve("reference", "target"), resolve("reference", "drafter")
    report = json.loads(args.report.read_text()) if args.report.is_file() else {}
    heldout = "\n".join(source_texts(None))  # the held-out stdlib files, as bench takes prompts
    args.report.parent.mkdir(parents=True, exist_ok=True)
    for quant in args.variants.split(","):
        folder = args.out / f"reference-{quant}"
        if args.only != "validate":
            t = time.perf_counter()
            drafter_mode, target_mode = VARIANTS[quant]
            export(ExportConfig(target=target, drafter=str(drafter), out=folder, quantize=drafter_mode,
                                quantize_target=target_mode, force=True), progress=True)
            report[quant] = {"export_s": time.perf_counter() - t, "files": sizes(folder)}
            print(f"{quant}: export {report[quant]['export_s']:.0f} s", flush=True)
        if args.only != "export":
            t = time.perf_counter()
            rows = summarize(validate(folder))
            report[quant]["validate_s"] = time.perf_counter() - t
            report[quant]["checks"] = checks(rows)
            print(f"{quant}: validate {report[quant]['validate_s']:.0f} s, "
                  f"{sum(r.ok for r in rows)}/{len(rows)} checks ok", flush=True)
            if quant != "none":
                report[quant]["heldout_checks"] = [c for c in checks(summarize(validate(folder, text=heldout)))
                                                   if c["kind"] == "agreement"]
        args.report.write_text(json.dumps(report, indent=1) + "\n")
    if args.only != "export":
        print(markdown(report))


def checks(rows) -> list[dict]:
    return [{"graph": r.graph, "output": r.output, "backend": r.backend, "kind": r.kind, "value": r.max_diff,
             "tolerance": r.tolerance, "ok": r.ok, "count": r.count} for r in rows]


def markdown(report: dict) -> str:
    names = sorted({f for r in report.values() for f in r["files"]
                    if f.endswith((".onnx", ".weights", ".pte"))})
    quants = [q for q in VARIANTS if q in report]
    lines = ["| file | " + " | ".join(f"{q} (KiB)" for q in quants) + " |", "|---" * (len(quants) + 1) + "|"]
    for name in names:
        cells = [f"{report[q]['files'][name] / 1024:,.0f}" if name in report[q]["files"] else "-" for q in quants]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines.append("| export wall time (s) | " + " | ".join(f"{report[q]['export_s']:.0f}" for q in quants) + " |")
    lines.append("| validate wall time (s) | " + " | ".join(f"{report[q]['validate_s']:.0f}" for q in quants) + " |")
    lines += ["", "| export | backend | worst fp32 logits diff | worst state diff | draft-token agreement "
              "(target-written / held-out text) |", "|---|---|---|---|---|"]
    for q in quants:
        for backend in ("onnxruntime", "executorch"):
            rows = [c for c in report[q].get("checks", []) if c["backend"] == backend]
            if not rows:
                continue
            held = [c for c in report[q].get("heldout_checks", []) if c["backend"] == backend]

            def worst(pred):
                vals = [c["value"] for c in rows if c["kind"] == "parity" and pred(c["output"])]
                return f"{max(vals):.1e}" if vals else "-"

            def value(output, fmt):
                vals = [[c["value"] for c in src if c["output"] == output and c["kind"] == "agreement"]
                        for src in (rows, held)]
                return " / ".join(fmt.format(v[0]) if v else "-" for v in vals) if vals[0] else "-"

            lines.append(f"| {q} | {backend} | {worst(lambda o: 'logits' in o)} | {worst(lambda o: 'state' in o)} | "
                         f"{value('draft_tokens', '{:.1%}')} |")
            for graph in ("target_prefill", "target_verify", "target_decode"):
                agree = [[c for c in src if c["graph"] == graph and c["kind"] == "agreement"] for src in (rows, held)]
                if agree[0]:
                    lines.append(f"| {q} | {backend} | {graph} argmax agreement | | " + " / ".join(
                        f"{a[0]['value']:.1%}" if a else "-" for a in agree) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
