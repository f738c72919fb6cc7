"""The command line's surface: docs/cli.md is the parser's own table, every option says what it
does, every command refuses bad input in one line (the parser class), and no option is
abbreviated."""
from __future__ import annotations

from pathlib import Path

from harness.cli.main import build_parser
from harness.cli.surface import commands, distinct_options, render, surface
from harness.cli.vocabulary import OneLineParser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_the_parsers_table():
    assert DOCS.read_text() == render(build_parser()), (
        "docs/cli.md is stale: python -m harness.cli.surface > docs/cli.md")


def test_every_option_says_what_it_does():
    silent = [(r.command, r.names) for r in surface(build_parser()) if not r.help]
    assert silent == []


def test_every_command_is_a_one_line_parser_without_abbreviations():
    for name, parser in commands(build_parser()):
        assert isinstance(parser, OneLineParser) and parser.allow_abbrev is False, name


def test_one_name_for_one_thing():
    rows = surface(build_parser())
    names = distinct_options(rows)
    # the names the vocabulary retired: each thing has one name now
    assert not names & {"--local", "--cell", "--vllm-releases", "--releases", "--table",
                        "--append"}
    # --json is a flag wherever it is, and --results-dir a folder, never a file to write
    for r in rows:
        if "--json" in r.names:
            assert r.value == "", r.command
    actions = [a for _, p in commands(build_parser()) for a in p._actions]
    assert all(a.nargs == 0 for a in actions if "--json" in a.option_strings)
    assert len(names) < 96   # 96 long option names before the shared vocabulary
