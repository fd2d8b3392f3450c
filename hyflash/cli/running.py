"""Run the loop: generate, chat, demo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hyflash.cli.args import CliError, add_pte_kernels, draft_cost, emit, positive, width
from hyflash.runtime_py.backends import BACKENDS  # numpy only: the --backend choices


def _prompt_ids(args, tokenizer) -> list[int]:
    if args.prompt_ids is not None:
        items = args.prompt_ids.split(",")
        bad = next((t for t in items if not t.strip().isdigit()), None)
        if bad is not None:
            what = "an empty item (a stray comma)" if not bad.strip() else f"{bad.strip()!r}"
            raise CliError(f"--prompt-ids must be comma-separated non-negative integers like 1,2,3; "
                           f"{args.prompt_ids!r} has {what}")
        return [int(t) for t in items]
    if args.prompt_file is not None:
        try:
            text = Path(args.prompt_file).read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise CliError(f"{args.prompt_file}: no such file") from None
        except UnicodeDecodeError:
            raise CliError(f"{args.prompt_file}: not valid UTF-8 text") from None
    else:
        text = args.prompt
    if tokenizer is None:
        raise CliError("this export has no tokenizer.json; pass --prompt-ids")
    return tokenizer.encode(text).ids


def _tokenizer(folder: Path):
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own exception type
        raise CliError(f"{path}: not a readable tokenizer ({str(e).splitlines()[0]})") from None


def _sampling(args):
    """--temperature / --top-p / --top-k, each defaulting to the export's generation_config.json (greedy
    where it does not sample, or where the export has none). Call after the export's checks."""
    from hyflash.runtime_py.sampling import Sampling

    given = {k: getattr(args, k) for k in ("temperature", "top_p", "top_k") if getattr(args, k) is not None}
    Sampling(**given)  # the flags' own values first (a bad one is named by its flag)
    source = args.folder / "generation_config.json"
    if not source.is_file():
        return Sampling(**given)
    from hyflash.models.generation import generation_config, sampling_defaults

    try:
        defaults, ignored = sampling_defaults(generation_config(args.folder))
    except OSError as e:  # transformers' error for an unreadable file
        raise CliError(f"{source}: not a readable generation config ({str(e).splitlines()[0]})") from None
    if ignored:
        print(f"note: {source} sets {', '.join(ignored)}, which hyflash does not apply", file=sys.stderr)
    try:
        return Sampling(**{**defaults, **given})
    except ValueError as e:  # then a value of the config's is out of range
        raise CliError(f"{source}: {e} (the generation config's value; pass the flag to override)") from None


def _generation(args):
    from hyflash.runtime_py.loop import GenerationConfig, Runtime

    runtime = Runtime(args.folder, args.backend, args.threads)  # the export's files checked first
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=_sampling(args), seed=args.seed,
                           ignore_eos=args.ignore_eos, draft="none" if args.no_draft else args.draft,
                           width=args.width, **draft_cost(args))
    return cfg, runtime


def _conversation(args, runtime, cfg):
    from hyflash.models.generation import load_tokenizer
    from hyflash.runtime_py.chat import Conversation, no_template

    generation = runtime.manifest.get("generation")
    if generation is None:
        raise CliError(f"{args.folder}: this export has no chat files (made before hyflash exported them); "
                       "re-export it")
    if not generation["chat_template"]:
        raise CliError(no_template(args.folder))
    tokenizer = load_tokenizer(args.folder)
    return Conversation(runtime, tokenizer, cfg, args.system), lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def _show(rounds, stats, decode, stops, stream) -> str | None:
    """Print a generation as it comes (text, or ids without a tokenizer), cut at the first stop string."""
    text, shown = "", 0
    for new in rounds:
        if decode is None:
            print(" ".join(map(str, new)), end=" ", file=stream, flush=True)
            continue
        text = decode(stats.tokens)
        hit = min((text.find(s, max(0, shown - len(s))) for s in stops if s in text), default=-1)
        if hit >= 0:
            text = text[:hit]
            stats.stop_reason = "stop string"
        print(text[shown:], end="", file=stream, flush=True)
        shown = len(text)
        if hit >= 0:
            break
    rounds.close()  # a generation stopped early ends now (the runtime is free for the next turn)
    print(file=stream)
    return text if decode else None


def _report(args, cfg, stats, text, runtime) -> None:
    """A generation's result: one JSON line on stdout (--json), else a one-line summary on stderr."""
    if args.json:
        print(json.dumps({**stats.to_json(), "text": text, "backend": args.backend, "draft": cfg.draft,
                          "pte_kernels": runtime.backend.kernels,
                          "threads": runtime.backend.threads or args.threads}),
              flush=True)
    else:
        print(f"[{len(stats.tokens)} tokens, {stats.rounds} rounds, tau {stats.acceptance_length:.2f}, "
              f"{stats.tokens_per_s:.1f} tokens/s, {stats.prefilled} of {stats.prompt_tokens} prompt tokens "
              f"prefilled; stop: {stats.stop_reason}]", file=sys.stderr)


def cmd_generate(args) -> int:
    from hyflash.runtime_py.loop import Stats

    if args.system is not None and args.chat is None:
        raise CliError("--system needs --chat (a raw --prompt is not templated)")
    cfg, runtime = _generation(args)
    stats = Stats()
    if args.chat is not None:
        conversation, decode = _conversation(args, runtime, cfg)
        rounds = conversation.turn(args.chat, stats)
    else:
        tokenizer = _tokenizer(args.folder)
        decode = tokenizer.decode if tokenizer else None
        rounds = runtime.generate(_prompt_ids(args, tokenizer), cfg, stats)
    _report(args, cfg, stats, _show(rounds, stats, decode, args.stop, sys.stderr if args.json else sys.stdout),
            runtime)
    return 0


def cmd_chat(args) -> int:
    """One user turn per input line; the target's cache and the drafter's context stay between turns."""
    from hyflash.runtime_py.loop import Stats

    cfg, runtime = _generation(args)
    conversation, decode = _conversation(args, runtime, cfg)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        message = line.rstrip("\n")
        if not message.strip():
            continue
        stats = Stats()
        _report(args, cfg, stats, _show(conversation.turn(message, stats), stats, decode, args.stop,
                                        sys.stderr if args.json else sys.stdout), runtime)
    return 0


def cmd_demo(args) -> int:
    from hyflash.demo import run_demo

    r = run_demo(args.max_new_tokens, progress=not args.json, pair=args.pair)

    def text() -> str:
        lines = [f"HyFlash drafter: tau {r['acceptance_length']:.2f} tokens/round, {r['tokens_per_s']:.1f} tokens/s: "
                 f"{r['speedup']:.2f}x"]
        for key, name in (("prompt-lookup", "prompt-lookup (no drafter)"),
                          ("hybrid", "hybrid (drafter or prompt-lookup, each round)")):
            if key in r:
                h = r[key]
                lines.append(f"{name}: tau {h['acceptance_length']:.2f}, {h['tokens_per_s']:.1f} tokens/s: "
                             f"{h['speedup']:.2f}x")
        lines.append(f"target-only: {r['target_only_tokens_per_s']:.1f} tokens/s (onnxruntime, same run, same tokens)")
        return "\n".join(lines)
    emit(args, r, text)
    return 0


def _add_generation_flags(p) -> None:
    p.add_argument("--max-new-tokens", type=positive(), default=128)
    p.add_argument("--temperature", type=float, default=None, help="default: the export's generation_config.json")
    p.add_argument("--top-p", type=float, default=None, help="default: the export's generation_config.json")
    p.add_argument("--top-k", type=int, default=None, help="0 = off; default: the export's generation_config.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    add_pte_kernels(p)
    p.add_argument("--draft", choices=["model", "prompt-lookup", "hybrid"], default="model",
                   help="hybrid: each round the drafter's or prompt-lookup's block, whichever is expected to go further")
    p.add_argument("--no-draft", action="store_true", help="target-only decoding (the baseline)")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="hybrid: draft_read's time as a share of the rest of a round (`hyflash profile` prints it "
                        "as draft_read_share); a round whose lookup match leaves the drafter less to add than that "
                        "skips it; 0: always run the drafter")
    p.add_argument("--width", type=width, default="full",
                   help="drafts verified a round: full (the whole block), a verify width of the export (the anchor "
                        "and W-1 drafts), or rule: chosen each round from the drafts' calibrated confidences and "
                        "this device's costs (`hyflash profile --write-costs`)")
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--json", action="store_true")


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="run the speculative loop on an export")
    p.add_argument("folder", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", type=Path)
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    src.add_argument("--chat", metavar="MESSAGE", help="a user message, rendered with the export's chat template")
    p.add_argument("--system", default=None, help="a system message (with --chat)")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_generate)


def _chat_parser(sub) -> None:
    p = sub.add_parser("chat", help="a multi-turn conversation on an export: one user turn per input line")
    p.add_argument("folder", type=Path)
    p.add_argument("--system", default=None, help="a system message")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_chat)


def _demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="export, validate and run a pair: one prompt, every drafting mode, compared")
    p.add_argument("--pair", choices=["smollm2-135m-instruct", "reference"], default=None,
                   help="default: smollm2-135m-instruct (its target pulled on first use, its HyFlash drafter "
                        "embedded) where this installation embeds that drafter, else the 10.5 M reference pair")
    p.add_argument("--max-new-tokens", type=positive(), default=96)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)



def register(sub) -> None:
    _generate_parser(sub)
    _chat_parser(sub)
    _demo_parser(sub)
