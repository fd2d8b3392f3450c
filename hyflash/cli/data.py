"""Training data: the stdlib corpus and tokenizer, chat prompts, regeneration, the feature cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hyflash.cli.args import CliError, positive


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


def cmd_regenerate(args) -> int:
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.runtime_py.manifest import sha256
    from hyflash.train.batches import corpus_tokenizer, is_corpus
    from hyflash.train.data import token_stream
    from hyflash.train.regenerate import ChatPrompts, RegenConfig, regenerate
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
    summary = regenerate(_on_device(load_target(folder), args.device), prompts, cfg, args.out, source)
    print(json.dumps(summary))
    return 0


def _on_device(model, requested: str):
    """The target on --device (auto: CUDA if visible, else MPS, else CPU)."""
    from hyflash.train.loop import pick_device

    try:
        return model.to(pick_device(requested))
    except ValueError as e:
        raise CliError(str(e)) from None


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
    from hyflash.models.files import sha256
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.models.loading import load_target, resolve, weights_sha256
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
    summary = regenerate_chats(_on_device(load_target(folder), args.device), tokenizer,
                               tuple(end_of_text_ids(folder, tokenizer)),
                               read_conversations(args.prompts_from), cfg, args.out, source)
    print(json.dumps(summary))
    return 0


def cmd_chat_prompts(args) -> int:
    from hyflash.models.files import write_json_atomic
    from hyflash.models.generation import end_of_text_ids, load_tokenizer
    from hyflash.models.loading import load_target, resolve
    from hyflash.train.chatprompts import PromptMix, build, kept_batches, read_conversations

    mix = PromptMix(magpie=args.magpie, writing=args.writing, questions=args.questions,
                    code_requests=args.code_requests, code=args.code, passages=args.passages,
                    follow_up_share=args.follow_up_share, seed=args.seed)
    if args.out.exists() and not args.force:
        raise CliError(f"{args.out}: exists; pass --force to write it again")
    heldout = read_conversations(args.heldout)
    folder = resolve(args.target, "target")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(folder)

    def progress(kind, done, total):
        print(f"self-written {kind}: {done}/{total}", file=sys.stderr, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    keep = args.out.with_name(args.out.name + ".magpie-batches")  # a rerun picks the questions up from here
    rows, summary = build(load_target(folder), tokenizer, tuple(end_of_text_ids(folder, tokenizer)), mix, heldout,
                          progress, keep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(args.out)
    write_json_atomic(args.out.with_suffix(".summary.json"), {"target": folder.name, **summary})
    for kept in kept_batches(keep).values():
        kept.unlink(missing_ok=True)
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


def _corpus_parser(sub) -> None:
    p = sub.add_parser("corpus", help="write the stdlib corpus and its train and held-out split")
    p.add_argument("--out", type=Path, default=Path("data/corpus"))
    p.set_defaults(func=cmd_corpus)


def _train_tokenizer_parser(sub) -> None:
    p = sub.add_parser("train-tokenizer", help="byte-level BPE on the corpus' train split")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--vocab-size", type=positive(), default=4096)
    p.add_argument("--out", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.set_defaults(func=cmd_train_tokenizer)


def _regenerate_parser(sub) -> None:
    p = sub.add_parser("regenerate", help="the target writes its own continuations of training prompts")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--prompts-from", type=Path, default=Path("data/corpus"),
                   help="a corpus folder (prompts cut from its train split) or a chat .jsonl (the target answers "
                        "every assistant turn, rendered with its own template)")
    p.add_argument("--tokenizer", type=Path, default=None, help="default: the target's tokenizer.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=positive(), default=1_000_000, help="response tokens to write, at least")
    p.add_argument("--greedy-share", type=float, default=0.5, help="share of sequences decoded greedily")
    p.add_argument("--temperature", type=float, default=1.0, help="for the sampled share")
    p.add_argument("--prompt-len", default="64..384", help="corpus prompts: lengths a..b (one per batch)")
    p.add_argument("--seq-len", type=positive(), default=None,
                   help="prompt + response tokens (default 512; conversations 1,024)")
    p.add_argument("--batch", type=positive(), default=32, help="sequences decoded at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--max-new-tokens", type=positive(), default=320, help="conversations: tokens per answer at most")
    p.add_argument("--no-features", action="store_true",
                   help="conversations: do not write the taps' features and labels in the same pass")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto",
                   help="where the target runs (auto: CUDA if visible, else MPS, else CPU); a shard's sampled "
                        "tokens come from the same seeded CPU generator on any device")
    p.set_defaults(func=cmd_regenerate)


def _chat_prompts_parser(sub) -> None:
    p = sub.add_parser("chat-prompts",
                       help="chat prompts made here: self-written questions and writing tasks, code and passage tasks")
    p.add_argument("--target", required=True, help="checkpoint folder or a pullable name (it writes the questions)")
    p.add_argument("--out", type=Path, required=True, help="a .jsonl of {\"turns\": [...], \"category\": ...}")
    p.add_argument("--heldout", type=Path, default=Path("data/chat/heldout.jsonl"),
                   help="prompts never to near-duplicate")
    p.add_argument("--magpie", type=int, default=2000, help="self-written questions")
    p.add_argument("--writing", type=int, default=500,
                   help="self-written writing tasks (poems, stories, emails, ...: the target completes an opener)")
    p.add_argument("--questions", type=int, default=0,
                   help="self-written short questions (\"Why do\", \"What is the difference between\", ...)")
    p.add_argument("--code-requests", type=int, default=0,
                   help="self-written code requests (\"Write a Python function that\", ...)")
    p.add_argument("--code", type=int, default=2000, help="tasks on standard-library functions")
    p.add_argument("--passages", type=int, default=1500, help="tasks on standard-library docstrings")
    p.add_argument("--follow-up-share", type=float, default=0.25, help="conversations given a second turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_chat_prompts)


def _cache_features_parser(sub) -> None:
    p = sub.add_parser("cache-features", help="the target's tap features and choices for a conversations folder")
    p.add_argument("folder", type=Path, help="a folder made by `hyflash regenerate --prompts-from PROMPTS.jsonl`")
    p.add_argument("--target", required=True, help="the target that regenerated it")
    p.add_argument("--threads", type=positive(), default=None)
    p.set_defaults(func=cmd_cache_features)



def register(sub) -> None:
    _corpus_parser(sub)
    _train_tokenizer_parser(sub)
    _regenerate_parser(sub)
    _chat_prompts_parser(sub)
    _cache_features_parser(sub)
