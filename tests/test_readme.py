"""The README's examples run as written.

Every command in a ```sh block, every ``$ command`` line in an output block, the Python API
block and the doctest block are run, each in a fresh sandbox holding what the README assumes:
``data/mnist/`` with the four IDX files (Debian's Fashion-MNIST stands in for MNIST, same
format and sizes) and the databases the "Looking at the data" section names. Commands that need
the real MNIST from the internet, or a second virtual environment, are listed in SKIPPED with
the reason; other tests cover them offline.
"""

from __future__ import annotations

import doctest
import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from helpers import FASHION_DIR, fashion_file

from mnist2db import convert

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

#: command prefix -> why it is not run here
SKIPPED = {
    "make mnist  ": "the real MNIST needs the internet",
    "make test": "the test suite itself",
    "make lint": "developer tooling, not an example",
    "make proto": "rewrites a source file (tests/test_proto.py checks it is fresh)",
    "make bench": "a benchmark, run on demand",
    "mnist2db fetch  ": "the real MNIST needs the internet",
    "scripts/get_mnist.sh": "the real MNIST needs the internet (test_create runs both scripts)",
}

SPLITS = ("train", "t10k")
KINDS = (("images", "idx3"), ("labels", "idx1"))


def readme_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block in README.md."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def sh_commands() -> list[str]:
    commands = []
    for lang, body in readme_blocks():
        if lang != "sh":
            continue
        for line in body.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def dollar_sessions() -> list[list[tuple[str, list[str]]]]:
    """Per output block holding ``$ `` lines: (command, expected output lines) in order."""
    sessions = []
    for lang, body in readme_blocks():
        if lang:
            continue
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
        if session:
            sessions.append(session)
    return sessions


def skip_reason(command: str) -> str | None:
    padded = command + "  " if command in ("mnist2db fetch", "make mnist") else command
    for prefix, reason in SKIPPED.items():
        if padded.startswith(prefix):
            return reason
    return None


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain IDX files under data/mnist and the databases the README's examples read."""
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
    # The README's tampered copy: one pixel byte of record 40000 changed (to 159).
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
    return work


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if command.startswith("make "):
        # The project's Makefile, with this test run's environment as its .venv. A copy of
        # pyproject.toml that keeps its time stamp tells make the environment is up to date.
        venv = BIN.parent
        if not (venv / ".installed-stamp").exists():
            pytest.skip("make examples need the .venv that `make test` sets up")
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


@pytest.mark.parametrize("command", sh_commands())
def test_sh_example(prepared: Path, tmp_path: Path, command: str) -> None:
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    done = run(command, sandbox(prepared, tmp_path))
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("session", dollar_sessions(), ids=lambda s: s[0][0][:40])
def test_output_example(
    prepared: Path, tmp_path: Path, session: list[tuple[str, list[str]]]
) -> None:
    """The commands of one output block, in order, in one sandbox; each gives its first line."""
    work = sandbox(prepared, tmp_path)
    for command, expected in session:
        assert skip_reason(command) is None, command
        done = run(command, work)
        first = expected[0] if expected else None
        if first is not None and first.startswith("Error: "):
            assert done.returncode == 1, done.stderr
            assert done.stderr.splitlines()[0] == first
            continue
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        if first is not None:
            assert (done.stdout + done.stderr).splitlines()[0] == first


def test_python_api_block(prepared: Path, tmp_path: Path) -> None:
    blocks = [body for lang, body in readme_blocks() if lang == "python" and ">>>" not in body]
    assert blocks, "README lost its Python API example"
    work = sandbox(prepared, tmp_path)
    for body in blocks:
        done = subprocess.run(
            [sys.executable, "-c", body], cwd=work, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr


def test_doctest_block(prepared: Path, tmp_path: Path) -> None:
    blocks = [body for lang, body in readme_blocks() if lang == "python" and ">>>" in body]
    assert blocks, "README lost its open_db example"
    work = sandbox(prepared, tmp_path)
    parser = doctest.DocTestParser()
    old = os.getcwd()
    os.chdir(work)
    try:
        for body in blocks:
            test = parser.get_doctest(body, {}, "README", str(README), 0)
            # torch is not a dependency: the DataLoader lines are the one thing not run here.
            test.examples = [
                e for e in test.examples if "torch" not in e.source and "DataLoader" not in e.source
            ]
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test)
            for name in list(test.globs):
                if hasattr(test.globs[name], "close"):
                    test.globs[name].close()
            assert runner.failures == 0
    finally:
        os.chdir(old)
