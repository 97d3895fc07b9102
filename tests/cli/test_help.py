"""``--help`` that can be pasted: every example is one unbroken line, at any terminal width,
that parses as the command it shows; every command's summary in ``mnist2db --help`` is a
whole phrase. (tests/test_readme.py runs the examples in a sandbox.)"""

from __future__ import annotations

import re
import shlex

import click
import pytest
from click.testing import CliRunner

from mnist2db.cli.app import COMMANDS, cli

WIDTHS = (40, 80, 200)


def help_text(command: str | None, width: int) -> str:
    args = ["--help"] if command is None else [command, "--help"]
    result = CliRunner().invoke(cli, args, terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.stdout


def help_examples(text: str) -> list[str]:
    """The lines under an ``Example:`` or ``Examples:`` heading of a help text, stripped."""
    examples = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"^(\s*)Examples?:\s*$", line)
        if not heading:
            continue
        for following in lines[i + 1 :]:
            indent = len(following) - len(following.lstrip())
            if not following.strip() or indent <= len(heading.group(1)):
                break
            examples.append(following.strip())
    return examples


def parse_example(example: str) -> None:
    """Parse each ``mnist2db ...`` of an example line (``&&`` chains too) as click parses
    it when run: a wrong option, value or argument count raises ``click.UsageError``."""
    words = shlex.split(example)
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    for part in parts:
        assert part[0] == "mnist2db", example
        name, args = part[1], part[2:]
        command = cli.get_command(click.Context(cli), name)
        assert command is not None, f"{example}: no command {name!r}"
        with command.make_context(
            name, list(args), parent=click.Context(cli, info_name="mnist2db")
        ):
            pass


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_example_is_one_line_at_any_width(command: str | None) -> None:
    """click rewraps help paragraphs to the terminal; the examples are kept verbatim (\\b),
    so a pasted example is one command, whatever the width."""
    at_width = {width: help_examples(help_text(command, width)) for width in WIDTHS}
    assert at_width[80], f"mnist2db {command or ''} --help shows no example"
    assert at_width[40] == at_width[80] == at_width[200]
    for example in at_width[80]:
        assert example.startswith("mnist2db "), example


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_example_parses(command: str | None) -> None:
    for example in help_examples(help_text(command, 80)):
        parse_example(example)


def test_a_broken_example_would_be_caught() -> None:
    """The checks above fail on what click's rewrapping and a typo produce."""
    wrapped = "  Examples:\n    mnist2db convert a b\n  c\n"
    assert help_examples(wrapped) == ["mnist2db convert a b"]
    with pytest.raises(click.UsageError):
        parse_example("mnist2db convert a b")  # OUT_DB missing: the wrapped-away word
    with pytest.raises(click.UsageError):
        parse_example("mnist2db convert --bakend=lmdb a b c")


def test_every_summary_is_a_whole_phrase() -> None:
    """``mnist2db --help`` lists each command with its whole summary (click cuts a
    docstring's first sentence at 45 characters with "..."); each is also the command's
    short_help."""
    listing = help_text(None, 80)
    for name, (_, summary) in COMMANDS.items():
        assert summary[0].isupper() and summary.endswith("."), summary
        assert "..." not in summary
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(summary)}$", listing, re.M), name
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and command.get_short_help_str(limit=200) == summary


def test_shell_completion_is_documented_and_works() -> None:
    """The group's help says how to turn completion on, and click's completion answers for
    the lazily loaded commands."""
    assert 'eval "$(_MNIST2DB_COMPLETE=bash_source mnist2db)"' in help_text(None, 80)
    result = CliRunner().invoke(
        cli,
        [],
        prog_name="mnist2db",
        env={
            "_MNIST2DB_COMPLETE": "bash_complete",
            "COMP_WORDS": "mnist2db conv",
            "COMP_CWORD": "1",
        },
    )
    assert result.exit_code == 0
    assert result.output.splitlines() == ["plain,convert"]
