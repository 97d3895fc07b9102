"""A signal at the worst moment of creating a temporary file leaves nothing behind:
``export``, ``mean`` and ``show --png`` create their temporaries where the clean-up
owns them (AtomicFile.create, on entering the ``with``).

The child process sends itself a real SIGINT or SIGTERM from inside the creation: right after
the file exists and before the stream on it is made (os.fdopen), or right after os.open
returned; the test then looks for any ``.NAME.mnist2db-tmp-…`` left in the directory."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx

from mnist2db import convert

CHILD = """
import os, signal, sys
sig, where, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
real = getattr(os, where)
fired = []

def hooked(*args, **kwargs):
    result = real(*args, **kwargs)
    fd = result if where == "open" else args[0]
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    if ".mnist2db-tmp-" in name and not fired:
        fired.append(name)
        os.kill(os.getpid(), sig)  # handled at the next bytecode: here, mid-creation
    return result

setattr(os, where, hooked)
sys.argv = ["mnist2db", *argv]
from mnist2db.cli.app import main
main(prog_name="mnist2db")
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    images = write_idx(tmp_path / "train-images-idx3-ubyte", make_images(8, 4, 5))
    labels = write_idx(tmp_path / "train-labels-idx1-ubyte", make_labels(8))
    out = tmp_path / "db"
    convert(images, labels, out)
    return out


@pytest.mark.parametrize("where", ["fdopen", "open"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", ["mean", "export", "show"])
def test_a_signal_while_creating_a_temporary_leaves_nothing(
    db: Path, tmp_path: Path, command: str, sig: int, where: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = {
        "mean": ["mean", db, out / "mean.binaryproto"],
        "export": ["export", db, out, "--prefix", "x"],
        "show": ["show", db, "--png", out / "grid.png"],
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(int(sig)), where, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (128 + sig, "Interrupted\n")
    assert sorted(p.name for p in out.iterdir()) == []
