"""`pd-accuracy` command line: one module per sub-command group, each exposing
`register(subparsers)`, registered here by name (the list below is the whole CLI). Every command
goes through the front door (harness.cli.front_door) before it runs: bad input is one line on
stderr and exit 2, before any process, environment or file is created."""
from __future__ import annotations

import argparse
import sys

import harness
from harness.cli import bench, calibration, ci, doctor, matrix, releases, run, warm, zoo
from harness.cli.vocabulary import OneLineParser
from harness.core.options import UsageError
from harness.core.outcomes import EXIT_USAGE

COMMAND_MODULES = (run, warm, matrix, bench, calibration, ci, zoo, doctor, releases)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pd-accuracy", description=harness.__doc__)
    parser.add_argument("--version", action="version", version=harness.__version__,
                        help="print the harness's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """The command line; `parser`: a built one to reuse (tests that run thousands of inputs)."""
    from harness.cli import front_door

    parser = parser or build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:   # a refused option (one line already said), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.argv = list(sys.argv[1:] if argv is None else argv)   # a release axis re-runs it
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        front_door.admit(args)
    except UsageError as exc:
        return front_door.report(str(exc))
    return int(args.func(args) or 0)


__all__ = ["OneLineParser", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
