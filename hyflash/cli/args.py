"""What every command shares: the error users see, one parser per kind of argument, output."""

from __future__ import annotations

import argparse
import json

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (naming the problem) and exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def positive(kind=int):
    """An argparse type: a number > 0 of `kind`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def share(text: str) -> float:
    """An argparse type: a share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {text!r}")
    return value


def int_list(minimum: int = 0):
    """An argparse type: comma-separated integers >= minimum, as a tuple."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {minimum}, got {text!r}")
        return values
    return parse


def width(text: str):
    """An argparse type: how many drafts a round verifies: full, rule, or a verify width (a number)."""
    if text in ("full", "rule"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected full, rule or a verify width (2..8), got {text!r}") from None


def widths(text: str) -> tuple:
    """An argparse type: comma-separated width policies (`width`)."""
    return tuple(width(x) for x in text.split(","))


def emit(args, data: dict, text) -> None:
    """One JSON line on stdout with --json, else the human form (`text()`, built only when needed)."""
    print(json.dumps(data) if args.json else text())


def draft_cost(args) -> dict:
    """--draft-cost where given (GenerationConfig's default otherwise)."""
    return {} if args.draft_cost is None else {"draft_cost": args.draft_cost}


def add_pte_kernels(p) -> None:
    """--pte-kernels: which build of the target's cache kernels ExecuTorch programs run (`ptekernels`)."""
    p.add_argument("--pte-kernels", choices=["hyflash", "executorch"], default="hyflash",
                   help="ExecuTorch programs: the project's cache kernels, as hyflash-run links them (default), "
                        "or ExecuTorch's own build, as apps linking its LLM kernels run them")


def choose_pte_kernels(args) -> None:
    """Fix the build of the cache kernels for this process before a command loads any program."""
    if getattr(args, "pte_kernels", None):
        from hyflash.runtime_py import ptekernels

        ptekernels.choose(args.pte_kernels)
