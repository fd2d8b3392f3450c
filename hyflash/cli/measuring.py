"""Measure: bench (by context or on chat), probe, profile."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hyflash.cli.args import CliError, add_pte_kernels, draft_cost, emit, positive, widths
from hyflash.runtime_py.backends import BACKENDS  # numpy only: the --backend choices


def cmd_bench(args) -> int:
    from hyflash.runtime_py.bench import BenchConfig, bench, format_results, plot
    from hyflash.runtime_py.sampling import Sampling

    if args.chat is not None:
        return _bench_chat(args)
    if args.peer or args.limit or args.runner or args.per_category or args.widths != ("full",):
        raise CliError("--peer, --limit, --per-category, --runner and --widths go with --chat")
    args.max_new_tokens = args.max_new_tokens or 64
    try:
        buckets = tuple(int(x) for x in args.buckets.split(","))
    except ValueError:
        raise CliError(f"--buckets must be comma-separated integers, got {args.buckets!r}") from None
    cfg = BenchConfig(artifacts=tuple(args.artifacts), buckets=buckets, prompts_from=args.prompts_from,
                      prompts_per_bucket=args.prompts_per_bucket, max_new_tokens=args.max_new_tokens,
                      threads=args.threads, backend=args.backend, seed=args.seed,
                      sampling=Sampling(args.temperature, args.top_p), **draft_cost(args))
    report = bench(cfg, progress=True)
    if args.plot:
        plot(report, args.plot)
    emit(args, report, lambda: format_results(report))
    return 0


def _bench_chat(args) -> int:
    from hyflash.models.files import write_json_atomic
    from hyflash.runtime_py.chatbench import ChatBenchConfig, bench_chat, format_chat

    if args.temperature or args.plot or args.prompts_from:
        raise CliError("--chat measures greedy chat answers; leave out --temperature, --plot and --prompts-from")
    peers = tuple(p for p in (args.peer or "").split(",") if p)
    cfg = ChatBenchConfig(artifacts=tuple(args.artifacts), chat=args.chat, max_new_tokens=args.max_new_tokens or 128,
                          threads=args.threads, backend=args.backend, limit=args.limit,
                          per_category=args.per_category, peers=peers,
                          runner=args.runner, widths=args.widths)
    report = bench_chat(cfg, progress=True)
    if args.out:
        write_json_atomic(args.out, report)
    emit(args, report, lambda: format_chat(report))
    return 0 if report["exact"] else 1


def cmd_probe(args) -> int:
    from hyflash.runtime_py.probe import KINDS, ProbeConfig, format_probe, plot_probe, probe

    kinds = KINDS if args.kind == "both" else tuple(args.kind.split(","))
    try:
        distances = tuple(int(x) for x in args.distances.split(","))
    except ValueError:
        raise CliError(f"--distances must be comma-separated integers, got {args.distances!r}") from None
    cfg = ProbeConfig(artifacts=tuple(args.artifacts), kinds=kinds, distances=distances, prompts=args.prompts,
                      max_new_tokens=args.max_new_tokens, prompts_from=args.prompts_from, seed=args.seed,
                      backend=args.backend, threads=args.threads, memory_history=args.memory_history,
                      chat=args.chat)
    report = probe(cfg, progress=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot_probe(report, args.plot)
    emit(args, report, lambda: format_probe(report))
    return 0


def cmd_profile(args) -> int:
    from hyflash.runtime_py.profile import format_profile, profile

    try:
        contexts = tuple(int(x) for x in args.contexts.split(","))
    except ValueError:
        raise CliError(f"--contexts must be comma-separated integers, got {args.contexts!r}") from None
    if not contexts or min(contexts) < 1:
        raise CliError(f"--contexts must be positive integers, got {args.contexts!r}")
    report = profile(args.folder, args.backend, contexts, args.threads, args.repeats, args.new_tokens,
                     optimum=not args.no_optimum, progress=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    emit(args, report, lambda: format_profile(report))
    if args.write_costs:
        from hyflash.runtime_py.chatbench import machine
        from hyflash.runtime_py.profile import cost_curve
        from hyflash.runtime_py.verifying import write_costs

        path = write_costs(args.folder, args.backend, cost_curve(report), machine(args.threads))
        print(f"wrote {path}: the width rule's costs on this device", file=sys.stderr)
    return 0


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="acceptance and speedup by context length, drafters side by side")
    p.add_argument("artifacts", type=Path, nargs="+", help="export folders of one target")
    p.add_argument("--buckets", default="256,512,1024,2048", help="bucket edges")
    p.add_argument("--prompts-from", type=Path, default=None, help="a file, or a folder of .py files")
    p.add_argument("--prompts-per-bucket", type=positive(), default=4)
    p.add_argument("--chat", type=Path, default=None,
                   help="a .jsonl of {\"turns\": [...], \"category\": ...}: every turn answered through the chat "
                        "template, reported by category (e.g. data/chat/heldout.jsonl)")
    p.add_argument("--widths", type=widths, default=("full",), metavar="P,P,...",
                   help="--chat: run each drafting mode under these verify-width policies side by side: full, a "
                        "verify width (2, 4, ...), rule (default: full)")
    p.add_argument("--peer", default=None,
                   help="with --chat: comma-separated peers measured beside hyflash: onnxruntime-genai, optimum-ort")
    p.add_argument("--limit", type=positive(), default=None, help="with --chat: the first N conversations")
    p.add_argument("--per-category", type=positive(), default=None,
                   help="with --chat: the first N conversations of each category (a smaller set that keeps every kind)")
    p.add_argument("--out", type=Path, default=None, help="with --chat: write the JSON report here too")
    p.add_argument("--runner", type=Path, default=None,
                   help="with --chat: hyflash-run (e.g. build/runtime_cpp/hyflash-run) answers every .pte export too, "
                        "target-only and drafted, one runner a conversation keeping its context between turns")
    p.add_argument("--max-new-tokens", type=positive(), default=None, help="default 64; with --chat 128 per answer")
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime",
                   help="every run, target-only included, on this backend")
    add_pte_kernels(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (outputs cross-checked)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="prompt lengths; sampled, prompt i uses seed + i")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="hybrid: draft_read's time as a share of the rest of a round (`hyflash profile` prints it "
                        "as draft_read_share); a round whose lookup match leaves the drafter less to add than that "
                        "skips it; 0: always run the drafter")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of tau and speedup by context")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)


def _probe_parser(sub) -> None:
    p = sub.add_parser("probe", help="tau when the continuation's evidence is near or far back (filler in between)")
    p.add_argument("artifacts", type=Path, nargs="+", help="export folders of one target")
    p.add_argument("--kind", default="both", help="nearby, distant or both")
    p.add_argument("--distances", default="256,768,1536", help="filler tokens between evidence and use")
    p.add_argument("--prompts", type=positive(), default=8, help="probes per kind and distance")
    p.add_argument("--max-new-tokens", type=positive(), default=64)
    p.add_argument("--prompts-from", type=Path, default=None, help="a file, or a folder of .py files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    add_pte_kernels(p)
    p.add_argument("--memory-history", type=positive(), default=None,
                   help="ablation: each mamba2 drafter again (eager backend), its memory limited to the last M features")
    p.add_argument("--chat", action="store_true",
                   help="probes as conversations through the export's chat template: the passage handed over in an "
                        "early turn, asked for word for word in the last")
    p.add_argument("--out", type=Path, default=None, help="write the report's JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of tau by distance")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)


def _profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="per-graph milliseconds by committed length, target-only tokens/s")
    p.add_argument("folder", type=Path)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    add_pte_kernels(p)
    p.add_argument("--contexts", default="256,1024,2048", help="committed lengths to measure at")
    p.add_argument("--repeats", type=positive(), default=30, help="calls per graph (the median is reported)")
    p.add_argument("--new-tokens", type=positive(), default=64, help="target-only tokens decoded per context")
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--no-optimum", action="store_true", help="leave out the optimum-ort baseline")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--write-costs", action="store_true",
                   help="write the verify-width costs measured here beside the export (costs-BACKEND.json), which "
                        "--width rule reads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile)



def register(sub) -> None:
    _bench_parser(sub)
    _probe_parser(sub)
    _profile_parser(sub)
