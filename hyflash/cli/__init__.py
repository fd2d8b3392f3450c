"""`hyflash`: the one console script. Arguments become typed configs here and nowhere else.

Every bad input ends in one line on stderr naming the problem and exit code 2. Each module of this
package holds a group of commands: its command functions and the parsers that call them.
"""

from __future__ import annotations

import sys

from hyflash.cli import data, exporting, measuring, models, research, running, training
from hyflash.cli.args import EXIT_USAGE, CliError, Parser, choose_pte_kernels

GROUPS = (models, exporting, running, measuring, data, training, research)


def build_parser() -> Parser:
    parser = Parser(prog="hyflash", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        choose_pte_kernels(args)
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
