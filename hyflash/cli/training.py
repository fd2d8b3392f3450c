"""Training: the drafter (and the reference target), hybrid calibration, target evaluation."""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.cli.args import CliError, emit, positive, share


def _train_config(args):
    from hyflash.train.loop import TrainConfig, pick_device

    pick_device(args.device)  # a missing device is refused before any data is read
    return TrainConfig(out=args.out, steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                       checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
                       device=args.device, stop_after=args.stop_after)


def _add_train_flags(p, steps: int, batch: int, lr: float) -> None:
    p.add_argument("--out", type=Path, required=True, help="run folder: checkpoints, log, final model")
    p.add_argument("--steps", type=positive(), default=steps)
    p.add_argument("--stop-after", type=positive(), default=None,
                   help="end the run after this step, keeping the lr schedule of --steps")
    p.add_argument("--batch", type=positive(), default=batch, help="global batch (sequences)")
    p.add_argument("--lr", type=positive(float), default=lr)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--checkpoint-every", type=positive(), default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto",
                   help="auto: CUDA if visible (cuda:LOCAL_RANK under torchrun), else MPS, else CPU")


def cmd_train_target(args) -> int:
    from hyflash.train.loop import is_writer
    from hyflash.train.target import train_target

    init_from = None
    if args.init_from:
        from hyflash.models.loading import resolve

        init_from = resolve(args.init_from, "target")
    dest = train_target(args.corpus, args.tokenizer, args.out, _train_config(args), args.seq_len,
                        args.layers, args.hidden, init_from, getattr(args, "curriculum", None),
                        getattr(args, "probe_every", None))  # the last two: `hyflash research train-target`
    if is_writer():
        print(f"wrote {dest}")
    return 0


# train-drafter's architecture flags and their defaults. The parser leaves them None, so that --init-from
# (which takes the architecture from its folder) can refuse any given beside it, defaults included.
_DRAFTER_SHAPE = {"memory": "mamba2", "window": "128", "layers": 2, "intermediate_size": None, "markov_rank": 64,
                  "no_confidence": False, "memory_history": None, "no_slot_attention": False, "draft_vocab": 0,
                  "lookup_input": False}


def _drafter_folder(name: str, flag: str) -> Path:
    from hyflash.models.loading import resolve

    folder = resolve(name, "drafter")
    if not (folder / "model.safetensors").is_file():
        raise CliError(f"{flag} {name}: not a drafter folder (config.json + model.safetensors), "
                       "such as a train-drafter run's model/")
    return folder


def _one_anchor_rule(args) -> None:
    if args.answer_horizon and args.distant_repeats is not None:
        raise CliError("--answer-horizon and --distant-repeats choose the anchors two ways; give one of them")


def cmd_train_drafter(args) -> int:
    from hyflash.models.drafter import DrafterConfig
    from hyflash.models.loading import load_target, resolve, weights_sha256
    from hyflash.train.batches import DistantRepeats, open_rows
    from hyflash.train.drafter import train_drafter
    from hyflash.train.loop import is_writer

    given = [k for k in _DRAFTER_SHAPE if getattr(args, k) is not None]
    add_lookup_input = bool(args.init_from and args.lookup_input)  # the one addition a trained drafter takes
    if add_lookup_input:
        given.remove("lookup_input")
    if args.init_from and given:
        raise CliError(f"--init-from takes the drafter's architecture from {args.init_from}; leave out "
                       + " ".join(f"--{k.replace('_', '-')}" for k in given))
    init_from = _drafter_folder(args.init_from, "--init-from") if args.init_from else None
    for k, default in _DRAFTER_SHAPE.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    _one_anchor_rule(args)
    train_cfg = _train_config(args)
    folder = resolve(args.target, "target")
    target = load_target(folder)
    rows = open_rows(args.data, folder, args.tokenizer, args.seq_len, weights_sha256(folder),
                     features=not args.no_feature_cache, horizon=args.answer_horizon)
    cached = getattr(rows, "features", False)
    if cached and rows.config.get("taps") != list(target.taps):
        raise CliError(f"{' '.join(map(str, args.data))}: its features are of taps {rows.config.get('taps')}, this "
                       f"target's drafter reads taps {list(target.taps)}; run `hyflash cache-features` for them")
    if args.soft_labels and not cached:
        raise CliError("--soft-labels reads the target's distribution from a feature cache: train on regenerated "
                       "conversations with their cache (leave out --no-feature-cache)")
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
                         init_from, add_lookup_input, args.slot_gamma, args.soft_labels or 0.0)
    if is_writer():
        print(f"wrote {dest}")
    return 0


def cmd_eval_drafter(args) -> int:
    import dataclasses

    import torch

    from hyflash.models.loading import load_drafter, load_target, resolve, weights_sha256
    from hyflash.train.batches import DistantRepeats, open_rows
    from hyflash.train.drafter import evaluate_drafter
    from hyflash.train.loop import pick_device

    _one_anchor_rule(args)
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    drafter_dir = _drafter_folder(args.drafter, "--drafter")
    target_dir = resolve(args.target, "target")
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target)
    if args.memory_history is not None:
        if drafter.cfg.memory != "mamba2":
            raise CliError(f"--memory-history limits a Mamba-2 memory; {args.drafter} has memory "
                           f"{drafter.cfg.memory!r}: leave it out")
        drafter.cfg = dataclasses.replace(drafter.cfg, memory_history=args.memory_history)
    rows = open_rows(args.data, target_dir, args.tokenizer, args.seq_len, weights_sha256(target_dir),
                     features=not args.no_feature_cache and args.distant_repeats is None, horizon=args.answer_horizon)
    if args.distant_repeats is not None:
        rows = DistantRepeats(rows, args.distant_repeats)
    target.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    drafter.to(device)
    report = {"drafter": str(drafter_dir), "target": str(target_dir), "data": " ".join(map(str, args.data)),
              "distant_repeats": args.distant_repeats, "memory_history": args.memory_history,
              "answer_horizon": args.answer_horizon,
              **evaluate_drafter(target, drafter, rows, args.rows, args.anchors)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    walked = "no round to walk" if report["walked_tau"] is None else \
        f"{report['walked_tau']:.3f} walked as the loop rounds on {report['walked_rows']} rows"
    emit(args, report, lambda: f"held-out tau {report['tau']:.3f} (teacher-forced, mean over anchors), {walked}; "
                               f"cross-entropy {report['ce']:.3f}, on {report['rows']} rows x {report['anchors']} "
                               "anchors")
    return 0


def cmd_calibrate(args) -> int:
    import numpy as np
    import torch

    from hyflash.models.hybrid import calibration
    from hyflash.models.loading import load_drafter, load_target, resolve, weights_sha256
    from hyflash.train.batches import response_anchors
    from hyflash.train.cached import is_conversations
    from hyflash.train.calibrate import chat_rows, measure_rounds, plot_reliability, write
    from hyflash.train.regenerate import is_regenerated, load_regenerated

    chat = is_conversations(args.data)
    if not chat and not is_regenerated(args.data):
        raise CliError(f"{args.data}: not a regenerated folder; calibration needs the target's own greedy text "
                       f"(`hyflash regenerate --target {args.target} --out {args.data}`)")
    target_dir, drafter_dir = resolve(args.target, "target"), resolve(args.drafter, "drafter")
    target = load_target(target_dir)
    if chat:  # the target's own answers to chat conversations
        tokens, anchorable = chat_rows(args.data, args.rows, weights_sha256(target_dir))
    else:
        data = load_regenerated(args.data)
        if data.config.get("target_sha256") != weights_sha256(target_dir):
            raise CliError(f"{args.data} was regenerated by another target; regenerate it with --target {args.target}")
        greedy = np.flatnonzero(data.greedy)[:args.rows]
        if not greedy.size:
            raise CliError(f"{args.data} has no greedy sequences; regenerate it with --greedy-share above 0")
        tokens = data.tokens[greedy]
        anchorable = response_anchors(data.prompt_len[greedy], data.tokens.shape[1], data.length[greedy])
    drafter = load_drafter(drafter_dir, target)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = measure_rounds(target, drafter, tokens, anchorable, progress=not args.json)
    cal = {**calibration(rounds), "data": str(args.data), "sequences": len(tokens)}
    path = write(cal, drafter_dir)
    if args.plot:
        plot_reliability(cal, args.plot, f"{drafter.cfg.name}: {cal['rounds']} training rounds")
    m = cal["mean_accepted"]
    emit(args, cal, lambda: f"wrote {path}: mean accepted drafts per round on {cal['rounds']} training rounds: "
          f"drafter {m['drafter']:.2f}, lookup {m['lookup']:.2f}, hybrid {m['hybrid']:.2f} (cross-fitted) "
          f"(better of the two each round {m['better_of_two']:.2f})")
    return 0


def cmd_eval_target(args) -> int:
    from hyflash.models.loading import load_target, resolve
    from hyflash.train.data import token_stream
    from hyflash.train.evaluate import loss_by_position, plot_loss_by_position

    target = load_target(resolve(args.target, "target"))
    stream = token_stream(args.corpus, args.tokenizer, "heldout")
    report = loss_by_position(target, stream, args.seq_len, args.windows)
    extra = getattr(args, "extend_report", None)  # `hyflash research eval-target` adds its probes here
    lines = extra(target, stream, report) if extra else []
    if args.plot:
        plot_loss_by_position(report, args.plot, {"drafter window 128": 128, "drafter training 512": 512})
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "per_position"}))
        return 0
    print(f"held-out loss {report['loss']:.3f} nats/token, next-token accuracy {report['accuracy']:.1%} "
          f"({report['windows']} windows of {report['seq_len']})")
    for b in report["loss_by_position"]:
        print(f"  positions {b['from']:>5}-{b['to']:<5} loss {b['loss']:.3f}")
    for line in lines:
        print(line)
    return 0


def _train_target_parser(sub):
    p = sub.add_parser("train-target", help="train the reference target (Qwen3 architecture)")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--tokenizer", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.add_argument("--seq-len", type=positive(), default=2048)
    p.add_argument("--layers", type=positive(), default=12)
    p.add_argument("--hidden", type=positive(), default=256)
    p.add_argument("--init-from", default=None, help="continue from this target folder's weights, or 'reference'")
    _add_train_flags(p, steps=900, batch=4, lr=2e-3)
    p.set_defaults(func=cmd_train_target)
    return p


def _eval_target_parser(sub):
    p = sub.add_parser("eval-target", help="held-out loss by position and next-token accuracy")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--tokenizer", type=Path, default=Path("data/corpus/tokenizer.json"))
    p.add_argument("--seq-len", type=positive(), default=2048)
    p.add_argument("--windows", type=positive(), default=64)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval_target)
    return p


def _calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="hybrid drafting's constants, measured on regenerated training text")
    p.add_argument("--drafter", required=True, help="drafter folder (hybrid.json is written there), or a reference name")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--data", type=Path, required=True, help="a regenerated folder (hyflash regenerate) of this target")
    p.add_argument("--rows", type=positive(), default=256, help="greedy sequences to measure on")
    p.add_argument("--plot", type=Path, default=None, help="write the reliability plot (PNG) here")
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)


def _train_drafter_parser(sub) -> None:
    p = sub.add_parser("train-drafter", help="distil a drafter from a frozen target")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--data", type=Path, nargs="+", default=[Path("data/corpus")],
                   help="a corpus folder (hyflash corpus), a regenerated folder (hyflash regenerate), or text files, "
                        "folders, .jsonl of {\"text\"} or chat {\"messages\"} (rendered with the target's template); "
                        "several conversations folders train as one set")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a tokenizer.json to use instead of the target's own")
    p.add_argument("--memory", choices=["mamba2", "gated_deltanet", "off"], help="default mamba2")
    p.add_argument("--window", help="committed features attended to, or 'full' (default 128)")
    p.add_argument("--layers", type=positive(), help="default 2")
    p.add_argument("--intermediate-size", type=positive(), help="MLP width (default: the target's)")
    p.add_argument("--markov-rank", type=int, help="default 64")
    p.add_argument("--no-confidence", action="store_const", const=True)
    p.add_argument("--memory-history", type=positive(), help="ablation: memory sees the last M only")
    p.add_argument("--no-slot-attention", action="store_const", const=True,
                   help="ablation: no attention among draft slots")
    p.add_argument("--draft-vocab", type=int,
                   help="N: the head predicts only the N most frequent target tokens of the data (default 0: all)")
    p.add_argument("--lookup-input", action="store_const", const=True,
                   help="draft_read also reads prompt-lookup's block and match length (docs/design.md); beside "
                        "--init-from, adds it to that drafter (its new weights start at zero)")
    p.add_argument("--init-from", default=None,
                   help="continue from this drafter folder's weights and architecture (bf16 weights, fresh optimizer "
                        "moments and lr schedule; calibrate again for hybrid drafting); no architecture flags beside it but "
                        "--lookup-input")
    p.add_argument("--seq-len", type=positive(), default=None,
                   help="training window (default 512; a regenerated folder's own length)")
    p.add_argument("--anchors", type=positive(), default=48, help="anchors sampled per sequence")
    p.add_argument("--distant-repeats", type=share, default=None, metavar="SHARE",
                   help="in this share of rows a span of 48-96 tokens is copied again 128-256 tokens after itself, "
                        "anchors only in the copy: evidence out of the window; held-out rows too")
    p.add_argument("--no-feature-cache", action="store_true",
                   help="a conversations folder: run the target on its rows instead of reading its feature cache")
    p.add_argument("--answer-horizon", type=positive(), default=None, metavar="N",
                   help="conversations: anchors only in each answer's first N tokens, the held-out rows' too (a loop "
                        "that stops after N new tokens drafts only those)")
    p.add_argument("--slot-gamma", type=positive(float), default=None, metavar="G",
                   help="slot k's loss weighs exp(-(k-1)/G) (default 4); a smaller G puts the weight on the first "
                        "slots, which every accepted draft needs")
    p.add_argument("--soft-labels", type=share, default=None, metavar="SHARE",
                   help="this share of each slot's loss is the cross-entropy against the target's whole distribution "
                        "over the draft vocabulary, the rest against its choice (default 0; needs the feature cache)")
    p.add_argument("--eval-every", type=positive(), default=100, help="held-out tau every K steps (in the log)")
    p.add_argument("--eval-rows", type=positive(), default=16, help="held-out rows the tau is measured on")
    _add_train_flags(p, steps=600, batch=4, lr=1e-3)
    p.set_defaults(func=cmd_train_drafter)


def _eval_drafter_parser(sub) -> None:
    p = sub.add_parser("eval-drafter", help="a drafter's held-out tau and cross-entropy, teacher-forced, as it is")
    p.add_argument("--drafter", required=True, help="drafter folder, or a reference name")
    p.add_argument("--target", required=True, help="checkpoint folder, or 'reference'")
    p.add_argument("--data", type=Path, nargs="+", required=True,
                   help="what train-drafter reads (--data there, one path or several conversations folders); "
                        "its held-out rows")
    p.add_argument("--tokenizer", type=Path, default=None, help="a tokenizer.json to use instead of the target's own")
    p.add_argument("--seq-len", type=positive(), default=None, help="row length (as train-drafter's)")
    p.add_argument("--rows", type=positive(), default=16, help="held-out rows to measure on")
    p.add_argument("--anchors", type=positive(), default=48, help="anchors per row")
    p.add_argument("--distant-repeats", type=share, default=None, metavar="SHARE",
                   help="rows with a distant repeat, anchors only in the copy (as train-drafter's)")
    p.add_argument("--memory-history", type=positive(), default=None,
                   help="ablation: the memory sees only the last M committed features")
    p.add_argument("--no-feature-cache", action="store_true", help="run the target instead of reading its cache")
    p.add_argument("--answer-horizon", type=positive(), default=None, metavar="N",
                   help="conversations: measure each answer's first N tokens alone (anchors as train-drafter's; the "
                        "walk stops at the N-th token)")
    p.add_argument("--threads", type=positive(), default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default="auto")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval_drafter)


def register(sub) -> None:
    _train_target_parser(sub)
    _eval_target_parser(sub)
    _calibrate_parser(sub)
    _train_drafter_parser(sub)
    _eval_drafter_parser(sub)
