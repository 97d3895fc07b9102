"""The examples of README.md and of every page in docs/ run as written.

Each fenced block of a page is one test, run in a fresh sandbox (a temporary directory
holding what the pages assume, below) with the project's commands on ``PATH``:

- a ```` ```sh ```` block: its commands, top to bottom, as a user would type them (a line
  ending in ``\\`` continues on the next; ``# ...`` comments are dropped); each must exit 0;
- a block without a language holding ``$ command`` lines: each command in order; the first
  line it prints must be the line below it (an ``Error: ...`` line: exit 1, on stderr);
- a ```` ```python ```` block: run as a script, or, with ``>>>`` prompts, as a doctest (lines
  that need torch are left out: torch is not a dependency);
- any other block (``text``, ``prototxt``, ...) is shown, not run.

The sandbox: ``data/mnist/`` with the four plain IDX files (Debian's Fashion-MNIST stands in
for MNIST: same format and sizes); the databases ``fashion_train_lmdb`` (LMDB) and
``fashion_test_leveldb`` (LevelDB) converted from them; ``tampered_lmdb``, a copy of the
first with one pixel byte of record 40000 changed; ``MNIST2DB_MIRROR`` naming Debian's
Fashion-MNIST, so ``fetch --dataset fashion-mnist`` works offline.

A block that cannot run here says why in the line just above its fence, and is skipped with
that reason: ``<!-- not run: needs NVIDIA DALI (tests/test_dali.py runs it) -->``. Commands
that need the real MNIST from the internet or are developer targets are in SKIPPED.
"""

from __future__ import annotations

import doctest
import gzip
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lmdb
import pytest
from helpers import FASHION_DIR, fashion_file

from mnist2db import convert

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent

#: command prefix -> why it is not run here
SKIPPED = {
    "make mnist  ": "the real MNIST needs the internet",
    "make test": "the test suite itself",
    "make lint": "developer tooling, not an example",
    "make docs": "rewrites docs/cli.md (tests/cli/test_cli_reference.py checks it is fresh)",
    "make proto": "rewrites a source file (tests/test_proto.py checks it is fresh)",
    "make bench": "a benchmark, run on demand",
    "make test-": "another test run",
    "mnist2db fetch  ": "the real MNIST needs the internet",
    "mnist2db fetch --dataset mnist": "the real MNIST needs the internet",
    "mnist2db fetch --dataset emnist": "EMNIST's archive (536 MiB) needs the internet",
    "scripts/get_mnist.sh": "the real MNIST needs the internet (test_create runs both scripts)",
    "pip install": "installs packages",
    ". .venv/bin/activate": "the sandbox has its own PATH",
}

NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
SPLITS = ("train", "t10k")
KINDS = (("images", "idx3"), ("labels", "idx1"))


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it starts, its language, its text, and the reason it
    is not run (from a ``<!-- not run: ... -->`` line just above it), if any."""

    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```([\w-]*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        above = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = NOT_RUN.search(above)
        body = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(page, i + 1, opening.group(1), body, marker and marker.group(1)))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def readme_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block in README.md."""
    return [(b.lang, b.body) for b in ALL_BLOCKS if b.page == README]


def block_commands(body: str) -> list[str]:
    """The commands of an sh block: comments dropped, ``\\`` continuations joined."""
    commands = []
    pending = ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = re.sub(r"\s+#\s.*$", "", pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def sh_commands() -> list[str]:
    """Every command of every sh block of the pages."""
    return [c for b in ALL_BLOCKS if b.lang == "sh" for c in block_commands(b.body)]


def dollar_session(body: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of each ``$ `` line of an output block, in order."""
    lines = body.splitlines()
    session = []
    for i, line in enumerate(lines):
        if not line.startswith("$ ") or line.startswith("$ #"):
            continue
        expected = []
        for following in lines[i + 1 :]:
            if following.startswith("$ "):
                break
            expected.append(following)
        session.append((line[2:], expected))
    return session


def skip_reason(command: str) -> str | None:
    padded = command + "  " if command in ("mnist2db fetch", "make mnist") else command
    for prefix, reason in SKIPPED.items():
        if padded.startswith(prefix):
            return reason
    return None


def blocks_of(kind: str) -> list[Block]:
    """The blocks that run as ``kind``: sh, session, script or doctest."""
    chosen = []
    for b in ALL_BLOCKS:
        if b.lang == "sh":
            found = "sh"
        elif b.lang == "" and dollar_session(b.body):
            found = "session"
        elif b.lang == "python":
            found = "doctest" if ">>>" in b.body else "script"
        else:
            continue
        if found == kind:
            chosen.append(b)
    return chosen


def params(kind: str) -> list[object]:
    return [pytest.param(b, id=b.name) for b in blocks_of(kind)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain IDX files under data/mnist and the databases the examples read."""
    fashion_file("train-images-idx3-ubyte")
    base = tmp_path_factory.mktemp("readme-base")
    data = base / "data" / "mnist"
    data.mkdir(parents=True)
    for split in SPLITS:
        for kind, rank in KINDS:
            name = f"{split}-{kind}-{rank}-ubyte"
            with gzip.open(FASHION_DIR / f"{name}.gz", "rb") as src, open(data / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    dbs = base / "dbs"
    convert(
        data / "train-images-idx3-ubyte",
        data / "train-labels-idx1-ubyte",
        dbs / "fashion_train_lmdb",
    )
    convert(
        data / "t10k-images-idx3-ubyte",
        data / "t10k-labels-idx1-ubyte",
        dbs / "fashion_test_leveldb",
        backend="leveldb",
    )
    # The pages' tampered copy: one pixel byte of record 40000 changed (to 159).
    shutil.copytree(dbs / "fashion_train_lmdb", dbs / "tampered_lmdb")
    env = lmdb.open(str(dbs / "tampered_lmdb"))
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(b"00040000"))
        value[9 + 397] = 159
        txn.put(b"00040000", bytes(value))
    env.close()
    return base


def sandbox(prepared: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(prepared / "data", work / "data", copy_function=os.link)
    for db in (prepared / "dbs").iterdir():
        shutil.copytree(db, work / db.name)
    (work / "scripts").symlink_to(ROOT / "scripts")  # run from the project root, as documented
    return work


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if command.startswith("make "):
        # The project's Makefile, with this test run's environment as its .venv. A copy of
        # pyproject.toml that keeps its time stamp tells make the environment is up to date.
        venv = BIN.parent
        stamps = [venv / s for s in (".installed-stamp", ".runtime-stamp")]
        if not all(s.exists() for s in stamps):
            pytest.skip("make examples need the .venv that `make test` sets up")
        if min(s.stat().st_mtime for s in stamps) < (ROOT / "pyproject.toml").stat().st_mtime:
            pytest.skip("the .venv is older than pyproject.toml: `make test` brings it up to date")
        shutil.copy2(ROOT / "pyproject.toml", cwd / "pyproject.toml")
        command = f"make -f {ROOT / 'Makefile'} VENV={venv} {command[5:]}"
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["MNIST2DB_MIRROR"] = str(FASHION_DIR)
    # Examples use shell syntax (&&, |, brace expansion): run them as a user's shell would.
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_every_page_has_its_examples_found() -> None:
    """The harness sees README's blocks and every page of docs/ (a page without a block that
    runs is fine; a fence the parser misses is not)."""
    assert blocks_of("sh") and blocks_of("session") and blocks_of("script")
    for page in PAGES:
        fences = sum(line.startswith("```") for line in page.read_text().splitlines())
        assert fences == 2 * len(page_blocks(page)), f"{page}: an unclosed or odd fence"


@pytest.mark.parametrize("block", params("sh"))
def test_sh_example(prepared: Path, tmp_path: Path, block: Block) -> None:
    """The commands of one sh block, in order, in one sandbox."""
    if block.not_run:
        pytest.skip(block.not_run)
    commands = block_commands(block.body)
    runnable = [c for c in commands if skip_reason(c) is None]
    if not runnable:
        pytest.skip(skip_reason(commands[0]) or "no command")
    work = sandbox(prepared, tmp_path)
    for command in runnable:
        done = run(command, work)
        assert done.returncode == 0, f"{block.name}: {command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"{block.name}: {command}\n{done.stderr}"


@pytest.mark.parametrize("block", params("session"))
def test_output_example(prepared: Path, tmp_path: Path, block: Block) -> None:
    """The commands of one output block, in order, in one sandbox; each gives its first line."""
    if block.not_run:
        pytest.skip(block.not_run)
    work = sandbox(prepared, tmp_path)
    for command, expected in dollar_session(block.body):
        assert skip_reason(command) is None, f"{block.name}: {command}"
        done = run(command, work)
        first = expected[0] if expected else None
        if first is not None and first.startswith("Error: "):
            assert done.returncode == 1, f"{block.name}: {command}\n{done.stderr}"
            assert done.stderr.splitlines()[0] == first, f"{block.name}: {command}"
            continue
        assert done.returncode == 0, f"{block.name}: {command}\n{done.stdout}\n{done.stderr}"
        if first is not None:
            said = (done.stdout + done.stderr).splitlines()
            assert said and said[0] == first, f"{block.name}: {command}\n{done.stderr}"


@pytest.mark.parametrize("block", params("script"))
def test_python_example(prepared: Path, tmp_path: Path, block: Block) -> None:
    if block.not_run:
        pytest.skip(block.not_run)
    work = sandbox(prepared, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", block.body], cwd=work, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{block.name}\n{done.stderr}"


@pytest.mark.parametrize("block", params("doctest"))
def test_doctest_example(prepared: Path, tmp_path: Path, block: Block) -> None:
    if block.not_run:
        pytest.skip(block.not_run)
    work = sandbox(prepared, tmp_path)
    parser = doctest.DocTestParser()
    old = os.getcwd()
    os.chdir(work)
    try:
        test = parser.get_doctest(block.body, {}, block.name, str(block.page), block.line)
        # torch is not a dependency: the DataLoader lines are the one thing not run here.
        test.examples = [
            e for e in test.examples if "torch" not in e.source and "DataLoader(" not in e.source
        ]
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test)
        for name in list(test.globs):
            if hasattr(test.globs[name], "close"):
                test.globs[name].close()
        assert runner.failures == 0, block.name
    finally:
        os.chdir(old)


#: The commands whose --help examples run here, in this order, in one sandbox (convert
#: writes what the others read). A new command's examples are parsed (tests/cli/test_help.py)
#: until it is added here.
HELP_EXAMPLES_RUN = (
    "convert",
    "fetch",
    "create",
    "show",
    "info",
    "verify",
    "export",
    "mean",
    "siamese",
)


def runnable_part(example: str) -> str:
    """The parts of an ``a && b`` example that can run here."""
    return " && ".join(p for p in example.split(" && ") if skip_reason(p.strip()) is None)


@pytest.mark.parametrize("commands", [(None,), HELP_EXAMPLES_RUN], ids=["group", "commands"])
def test_help_examples_run(
    prepared: Path, tmp_path: Path, commands: tuple[str | None, ...]
) -> None:
    """What ``--help`` shows as examples works when pasted, top to bottom."""
    from click.testing import CliRunner

    from mnist2db.cli.app import cli

    work = sandbox(prepared, tmp_path)
    ran = 0
    for command in commands:
        args = ["--help"] if command is None else [command, "--help"]
        text = CliRunner().invoke(cli, args, terminal_width=80).stdout
        examples = [
            line.strip()
            for line in text.split("Examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        ]
        assert examples, f"mnist2db {command} --help: no examples"
        for example in examples:
            example = runnable_part(example)
            if not example:
                continue
            done = run(example, work)
            assert done.returncode == 0, f"{example}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr
            ran += 1
    assert ran >= len(commands)


def test_the_python_api_page_keeps_its_examples() -> None:
    """The Python API page shows scripts and a doctest session, and they run (above)."""
    page = ROOT / "docs" / "python-api.md"
    kinds = {(b.lang, ">>>" in b.body) for b in ALL_BLOCKS if b.page == page}
    assert ("python", False) in kinds and ("python", True) in kinds


def test_every_test_the_guarantees_name_exists() -> None:
    """docs/guarantees.md names the tests that keep each guarantee: each exists (a name
    ending in ``*`` is a prefix), and so does each test file it names."""
    page = (ROOT / "docs" / "guarantees.md").read_text()
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    defined = set(re.findall(r"^def (test_\w+)\(", sources, flags=re.M))
    named = re.findall(r"`(test_\w+\*?)`", page)
    assert len(named) > 50
    for name in named:
        if name.endswith("*"):
            assert any(d.startswith(name[:-1]) for d in defined), name
        else:
            assert name in defined, name
    for path in re.findall(r"`(tests/[\w/]+\.py)`", page):
        assert (ROOT / path).is_file(), path


def test_make_mnist_installs_only_what_it_runs(tmp_path: Path) -> None:
    """``make mnist`` sets up the package alone; the test tools come with ``make test``."""

    def planned(target: str) -> str:
        done = subprocess.run(
            ["make", "-n", f"VENV={tmp_path / 'venv'}", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    mnist = planned("mnist")
    assert "pip install --quiet --disable-pip-version-check -e .\n" in mnist
    assert "[test]" not in mnist
    assert "mnist2db fetch --dataset mnist" in mnist
    assert "-e '.[test]'" in planned("test")


#: Pages other work is writing; a link to one is checked once the page exists.
PENDING_PAGES: set[str] = set()


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (lower case, punctuation dropped,
    spaces as hyphens)."""
    anchors = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        heading = None if in_fence else re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_somewhere(page: Path) -> None:
    """Each relative link of README.md and docs/ names a file that exists, and each
    #anchor a heading of that page: every task is one click away."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        where = str(linked.relative_to(ROOT)) if linked.is_relative_to(ROOT) else str(linked)
        if not linked.exists() and where in PENDING_PAGES:
            continue
        assert linked.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in heading_anchors(linked), f"{page.name}: {target}"
