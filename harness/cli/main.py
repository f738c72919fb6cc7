"""`pd-accuracy` command line: one module per sub-command group, each exposing
`register(subparsers)`, registered here by name (the list below is the whole CLI)."""
from __future__ import annotations

import argparse
import sys

import harness
from harness.cli import bench, calibration, ci, doctor, matrix, releases, run, warm, zoo
from harness.core.outcomes import EXIT_USAGE

COMMAND_MODULES = (run, warm, matrix, bench, calibration, ci, zoo, doctor, releases)


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2 (argparse would print the whole usage
    first); sub-command parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        from harness.core.redact import redact

        self.exit(EXIT_USAGE, f"{self.prog}: error: {redact(' '.join(message.split()))[:500]}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pd-accuracy", description=harness.__doc__)
    parser.add_argument("--version", action="version", version=harness.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # a release axis re-runs it
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
