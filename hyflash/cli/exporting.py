"""Export and validate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hyflash.cli.args import CliError, add_pte_kernels, emit, int_list, positive
from hyflash.runtime_py.manifest import VERIFY_WIDTHS


def cmd_export(args) -> int:
    from hyflash.export.pipeline import ExportConfig, export, peak_rss_bytes

    formats = ("onnx", "pte") if args.format == "both" else (args.format,)
    cfg = ExportConfig(target=args.target, drafter=args.drafter, out=args.out, formats=formats, window=args.window,
                       max_context=args.max_context, prefill_chunk=args.prefill_chunk,
                       verify_widths=args.verify_widths, quantize=args.quantize,
                       quantize_target=args.quantize_target, target_compute=args.target_compute,
                       quantize_embeddings=args.quantize_embeddings, dtype=args.dtype, pte_kernels=args.program_kernels,
                       seed=args.seed, force=args.force)
    manifest = export(cfg, progress=True)
    summary = {"out": str(args.out), "graphs": sorted(manifest["graphs"]), "drafter": manifest["drafter"]["name"],
               "max_context": manifest["max_context"], "window": manifest["window"],
               "bytes": {k: (Path(args.out) / k).stat().st_size for k in manifest["files"]},
               "peak_rss_bytes": peak_rss_bytes()}
    emit(args, summary, lambda: f"wrote {args.out}: {len(summary['graphs'])} graphs, drafter "
          f"{summary['drafter']}, context {summary['max_context']}, window {summary['window']}; "
          f"{sum(summary['bytes'].values()) / 2**20:,.1f} MiB; peak RSS {summary['peak_rss_bytes'] / 2**30:.2f} GiB")
    return 0


def cmd_validate(args) -> int:
    from hyflash.export.validate import format_table, summarize, validate

    text = None
    if args.text is not None:
        if not args.text.is_file():
            raise CliError(f"{args.text}: no such file (--text takes a text file to measure agreement on)")
        text = args.text.read_text(encoding="utf-8", errors="replace")
    rows = summarize(validate(args.folder, args.target, args.atol, min_agreement=args.min_agreement, text=text))
    failed = [r for r in rows if not r.ok]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [r.__dict__ for r in rows]}))
    else:
        print(format_table(rows))
        print(f"{len(rows) - len(failed)}/{len(rows)} outputs within tolerance")
    if failed:
        worst = failed[0]
        what = (f"agreement {worst.max_diff:.1%} < {worst.tolerance:.0%}" if worst.kind == "agreement"
                else f"{worst.max_diff:.3g} > {worst.tolerance:.2g} (atol + rtol x {worst.scale:.3g})")
        print(f"hyflash validate: error: {len(failed)} outputs out of tolerance; {worst.graph}.{worst.output} "
              f"on {worst.backend}: {what}", file=sys.stderr)
        return 1
    return 0


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a target and drafter to ONNX and ExecuTorch graphs")
    p.add_argument("--target", required=True, help="Hugging Face checkpoint folder, or 'reference'")
    p.add_argument("--drafter", required=True, help="drafter folder, a reference name, or 'random'")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--format", choices=["onnx", "pte", "both"], default="both")
    p.add_argument("--window", type=positive(), default=None)
    p.add_argument("--max-context", type=positive(), default=None)
    p.add_argument("--prefill-chunk", type=positive(), default=64)
    p.add_argument("--verify-widths", type=int_list(2), default=VERIFY_WIDTHS, metavar="W,W,...",
                   help="rows of the verify graphs (the anchor and W-1 drafts), 2..8 with 8 among them; the loop "
                        "picks one each round (default: %(default)s)")
    p.add_argument("--quantize", choices=["none", "int8", "int4"], default="none", help="the drafter")
    p.add_argument("--quantize-target", choices=["none", "int4"], default="none")
    p.add_argument("--target-compute", choices=["fp32", "int8"], default="fp32",
                   help="an ONNX int4 target's arithmetic: fp32 (default), or int8 (faster, several rows above "
                        "all), exact because single-token steps then run the two-row verify graph too (validate "
                        "checks it on this machine)")
    p.add_argument("--quantize-embeddings", choices=["none", "int8", "int4", "drafter-int8", "drafter-int4"],
                   default="none", help="both models' vocabulary tables: embedding, LM head, Markov head; "
                   "drafter-int8|drafter-int4: only the drafter's graphs read quantized copies, the target's graphs "
                   "keep theirs (ONNX only)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="the graphs' float dtype, weights, I/O and KV cache alike; fp16 steps run the two-row verify "
                        "graph, exact (bf16 is refused: no CPU backend here runs it)")
    p.add_argument("--pte-kernels", choices=["hyflash", "executorch"], default=None, dest="program_kernels",
                   help=".pte: the build of the target's cache kernels the program is exact with. hyflash (default "
                        "for fp32): the project's, as hyflash-run and the Python runtime load them; a verify block "
                        "then attends in one call. executorch (default for fp16): ExecuTorch's LLM kernels, as "
                        "apps linking them run; a verify block attends row by row (exact with either build)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)


def _validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="check every exported graph against eager PyTorch")
    p.add_argument("folder", type=Path)
    p.add_argument("--target", default=None, help="target folder, if it moved since export")
    p.add_argument("--atol", type=positive(float), default=None,
                   help="one absolute bar for every output, instead of atol + rtol x the reference's scale")
    p.add_argument("--min-agreement", type=float, default=0.9,
                   help="quantized graphs: least token agreement with fp32 that passes")
    p.add_argument("--text", type=Path, default=None,
                   help="quantized graphs: measure agreement on this text file (default: text the target writes)")
    add_pte_kernels(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)



def register(sub) -> None:
    _export_parser(sub)
    _validate_parser(sub)
