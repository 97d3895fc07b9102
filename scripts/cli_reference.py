#!/usr/bin/env python3
"""Write docs/cli.md, the command reference, from the commands' own ``--help``.

    python scripts/cli_reference.py           # (re)write docs/cli.md  (make docs)
    python scripts/cli_reference.py --check   # exit 1 if docs/cli.md is not what it would write

Every ``mnist2db`` command in the table of commands (``mnist2db.cli.app.COMMANDS``), in its
order, rendered by click at 80 columns; then every drop-in console script of
pyproject.toml (``mnist2db.caffe_tools.*``), whose gflags-style ``--help`` is printed by a
fresh interpreter. tests/cli/test_cli_reference.py fails when the file is stale.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
WIDTH = 80

HEADER = """\
# Command reference

Generated from `--help` by `scripts/cli_reference.py` (`make docs`); do not edit by hand:
`tests/cli/test_cli_reference.py` fails when this page is stale. The guides explain the
commands with examples: [converting](converting.md), [fetching](fetching.md),
[Caffe's tools](caffe-tools.md), [your own images](own-images.md),
[looking at data](looking.md).

Exit codes: 0 success, 1 a failure of the work (one `Error: ...` line on stderr), 2 a usage
error, 130 and 143 on SIGINT and SIGTERM.

Shell completion (click's): add the line for your shell to its start-up file.

```text
eval "$(_MNIST2DB_COMPLETE=bash_source mnist2db)"     # ~/.bashrc
eval "$(_MNIST2DB_COMPLETE=zsh_source mnist2db)"      # ~/.zshrc
_MNIST2DB_COMPLETE=fish_source mnist2db | source      # ~/.config/fish/completions/mnist2db.fish
```
"""


def click_help(args: list[str]) -> str:
    """What ``mnist2db ARGS --help`` prints, at WIDTH columns."""
    from click.testing import CliRunner

    from mnist2db.cli.app import cli

    result = CliRunner().invoke(cli, [*args, "--help"], prog_name="mnist2db", terminal_width=WIDTH)
    if result.exit_code != 0:
        raise SystemExit(f"mnist2db {' '.join(args)} --help exited {result.exit_code}")
    return result.stdout


def drop_ins() -> list[tuple[str, str, str]]:
    """``(script, module, function)`` of each drop-in console script in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return re.findall(r'^(\w+)\s*=\s*"(mnist2db\.caffe_tools\.[\w.]+):(\w+)"', section, re.M)


def drop_in_help(script: str, module: str, function: str) -> str:
    """What the installed ``SCRIPT --help`` prints (run as its console script runs it)."""
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {function}; {function}()"
    done = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} --help exited {done.returncode}: {done.stderr}")
    return done.stdout


def fenced(text: str) -> str:
    return "```text\n" + text.rstrip("\n") + "\n```\n"


def render() -> str:
    """The whole of docs/cli.md."""
    from mnist2db.cli.app import COMMANDS

    parts = [HEADER, "\n## Commands\n\n| command | what it does |\n|---|---|\n"]
    parts += [
        f"| [`{name}`](#mnist2db-{name}) | {summary} |\n" for name, (_, summary) in COMMANDS.items()
    ]
    scripts = drop_ins()
    if scripts:
        names = ", ".join(f"[`{s}`](#{s})" for s, _, _ in scripts)
        parts.append(f"\nCaffe's drop-ins: {names}.\n")
    parts.append("\n## mnist2db\n\n" + fenced(click_help([])))
    for name in COMMANDS:
        parts.append(f"\n## mnist2db {name}\n\n" + fenced(click_help([name])))
    if scripts:
        parts.append(
            "\n## The drop-ins\n\nCaffe's command lines, with gflags' syntax and glog's lines "
            "([Caffe's tools](caffe-tools.md#the-drop-ins-caffes-command-lines)).\n"
        )
        for script, module, function in scripts:
            parts.append(f"\n### {script}\n\n" + fenced(drop_in_help(script, module, function)))
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run make docs", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text)
    print(f"Wrote {OUT.relative_to(ROOT)} ({text.count(chr(10))} lines).", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
