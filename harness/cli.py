"""`pd-accuracy` command line. Each sub-command lives in its own `harness/cli_*.py` module that
exposes `register(subparsers)`; this file only collects them."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import harness

# exit codes (documented in README's verdict table)
EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2        # bad input: nothing was started
EXIT_ERROR = 3        # environment error: retry is reasonable
EXIT_INCONCLUSIVE = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-accuracy", description=harness.__doc__)
    parser.add_argument("--version", action="version", version=harness.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(harness.__path__), key=lambda m: m.name):
        if mod.name.startswith("cli_"):
            importlib.import_module(f"harness.{mod.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
