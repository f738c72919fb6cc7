"""The command line's surface, read from the parser: every command, every option with its value
and help. `python -m harness.cli.surface > docs/cli.md` writes the table; a test keeps the file
current, so the docs never describe an option the parser does not have."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Iterator

HEADER = """# The command line

Generated from the parser by `python -m harness.cli.surface > docs/cli.md` (a test keeps it
current). Every command checks all of its input before it starts anything
(harness/cli/front_door.py): a bad value, an option the command would not use, a
`PD_ACCURACY_*` variable it cannot read, is one line on stderr and exit 2. Options are never
abbreviated. With a profile, the options of one `--model` cell pick the profile's cells that
have that value.

The same thing has the same name everywhere: `--results-dir` is the folder of records,
`--vllm` the vLLM releases, `--platform` the machine cells are expanded for, `--json` prints
JSON, `--out FILE` / `--out-dir DIR` are where a command writes its file(s).
"""


@dataclass(frozen=True)
class Option:
    command: str
    names: tuple[str, ...]
    value: str
    default: str
    help: str


def commands(parser: argparse.ArgumentParser, prefix: str = ""
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of every command and sub-command, in the order they are registered."""
    for name, sub, _ in command_helps(parser, prefix):
        yield name, sub


def command_helps(parser: argparse.ArgumentParser, prefix: str = ""
                  ) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help line) of every command and sub-command."""
    for action in parser._actions:   # noqa: SLF001 - argparse has no public walk of its options
        if isinstance(action, argparse._SubParsersAction):   # noqa: SLF001
            helps = {c.dest: c.help or "" for c in action._choices_actions}   # noqa: SLF001
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                yield full, sub, helps.get(name, "")
                yield from command_helps(sub, full)


def options(parser: argparse.ArgumentParser, command: str) -> list[Option]:
    """The options and positionals of one command's parser (help and hidden ones left out)."""
    rows = []
    for action in parser._actions:   # noqa: SLF001
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):   # noqa: SLF001
            continue
        if action.help == argparse.SUPPRESS:
            continue
        takes = action.nargs != 0
        value = (action.metavar or action.dest.upper()) if takes else ""
        if action.choices and not action.metavar:
            value = "|".join(map(str, action.choices))
        default = "" if action.default in (None, False, argparse.SUPPRESS, []) else str(action.default)
        names = tuple(action.option_strings) or (action.dest,)
        rows.append(Option(command, names, str(value), default, " ".join((action.help or "").split())))
    return rows


def surface(parser: argparse.ArgumentParser) -> list[Option]:
    rows = options(parser, "")
    for name, sub in commands(parser):
        rows += options(sub, name)
    return rows


def distinct_options(rows: list[Option]) -> set[str]:
    """Every option name spelled anywhere (`--profile`, `-k`), positionals and --help left out."""
    return {n for r in rows for n in r.names if n.startswith("-")}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md: the commands, then one row per option with the commands that take it (an
    option shared by several commands is one row: the shared vocabulary shows)."""
    rows = surface(parser)
    cmds = [(name, sub) for name, sub in commands(parser)]
    lines = [HEADER, f"{len([c for c, _ in cmds if ' ' not in c])} commands, "
                     f"{len(distinct_options(rows))} distinct options.", "",
             "| command | what it does | options |", "|---|---|---|"]
    helps = {name: text for name, _, text in command_helps(parser)}
    for name, _ in cmds:
        count = len([r for r in rows if r.command == name])
        lines.append(f"| `{name}` | {_cell(helps.get(name) or '')} | {count} |")
    lines += ["", "## Options", "", "| option | value | commands | what it does |",
              "|---|---|---|---|"]
    by_option: dict[tuple[str, ...], list[Option]] = {}
    for r in rows:
        by_option.setdefault(r.names, []).append(r)
    for names, mine in by_option.items():
        texts: dict[str, list[str]] = {}
        for r in mine:
            texts.setdefault(r.help, []).append(r.command or "pd-accuracy")
        what = (next(iter(texts)) if len(texts) == 1 else
                " — ".join(f"{', '.join(c)}: {h}" for h, c in texts.items()))
        value = next((r.value for r in mine if r.value), "")
        lines.append(f"| {', '.join(f'`{n}`' for n in names)} | "
                     f"{f'`{_cell(value)}`' if value else ''} | "
                     f"{', '.join(r.command or 'pd-accuracy' for r in mine)} | {_cell(what)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from harness.cli.main import build_parser

    print(render(build_parser()), end="")


if __name__ == "__main__":
    main()
