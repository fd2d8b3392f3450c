"""`hyflash research ...`: options of the reference target's experiments, kept apart from the product's
commands (research/README.md lists the studies that use them)."""

from __future__ import annotations

from functools import partial

from hyflash.cli.args import int_list, positive
from hyflash.cli.training import _eval_target_parser, _train_target_parser
from hyflash.train.repeats import CURRICULA  # numpy only: the --curriculum choices


def _copy_report(fillers: tuple[int, ...], probes: int, target, stream, report: dict) -> list[str]:
    """The distant-repeat copy rate at each filler length, added to eval-target's report; its text lines."""
    from hyflash.train.copyprobe import copy_accuracy, copy_breakdowns, recovery_accuracy

    report["copy_breakdown"] = copy_breakdowns(target, stream, fillers, probes)
    report["copy_rate"] = {name: b["rate"] for name, b in report["copy_breakdown"].items()}
    report["copy_accuracy_teacher_forced"] = {f"copy_{f}": copy_accuracy(target, stream, f, probes) for f in fillers}
    report["copy_recovery_teacher_forced"] = {f"copy_{f}": recovery_accuracy(target, stream, f, probes)
                                              for f in fillers}
    lines = []
    for name, b in report["copy_breakdown"].items():
        after = "-" if b["after_miss"] is None else f"{b['after_miss']:.1%}"
        lines.append(f"  distant-repeat copy rate, filler {name[5:]}: {b['rate']:.1%} (unbroken for "
                     f"{b['unbroken']:.1f} tokens; after the first miss {after} match)")
        forced, recovery = report["copy_accuracy_teacher_forced"][name], report["copy_recovery_teacher_forced"][name]
        lines.append(f"    teacher-forced: {forced:.1%} of the copy's tokens; after one own miss "
                     + ("-" if recovery is None else f"{recovery:.1%}"))
    return lines


def _eval_target(args):
    from hyflash.cli.training import cmd_eval_target

    if args.copy_fillers:
        args.extend_report = partial(_copy_report, args.copy_fillers, args.copy_probes)
    return cmd_eval_target(args)


def register(sub) -> None:
    p = sub.add_parser("research", help="the reference target's experiments (research/README.md)")
    inner = p.add_subparsers(dest="study", required=True, parser_class=type(p))
    t = _train_target_parser(inner)
    t.add_argument("--curriculum", choices=sorted(CURRICULA), default=None,
                   help="mix in repeated-span rows (hyflash.train.repeats)")
    t.add_argument("--probe-every", type=positive(), default=None,
                   help="every K steps log the copy rate and held-out loss (hyflash.train.copytrain)")
    e = _eval_target_parser(inner)
    e.add_argument("--copy-fillers", type=int_list(0), default=None,
                   help="also the distant-repeat copy rate at these filler lengths")
    e.add_argument("--copy-probes", type=positive(), default=16, help="probes per filler length")
    e.set_defaults(func=_eval_target)
