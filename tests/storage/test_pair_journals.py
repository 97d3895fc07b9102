"""recover_together reads only what place_together writes: a FIFO named like a pair journal
hung `export` forever, a link to /dev/zero read until the process was killed. Such entries
are never read on, nor removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx

from mnist2db import convert

JOURNAL = ".x-images-idx3-ubyte.mnist2db-pair-999999-abcdef"  # of a process long gone


@pytest.fixture
def db(tmp_path: Path) -> Path:
    images = write_idx(tmp_path / "i", make_images(5, 3, 3))
    labels = write_idx(tmp_path / "l", make_labels(5))
    out = tmp_path / "db"
    convert(images, labels, out)
    return out


def _make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "too large":
        path.write_bytes(b"[" + b" " * (2 << 20) + b"]")
    else:  # JSON nested past Python's recursion limit
        path.write_bytes(b"[" * 200_000 + b"]" * 200_000)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "too large", "nested"])
def test_export_is_not_held_up_by_what_looks_like_a_journal(
    db: Path, tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _make(kind, out / JOURNAL)
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db", "export", str(db), str(out), "--prefix", "x", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    names = sorted(os.listdir(out))
    assert "x-images-idx3-ubyte" in names and "x-labels-idx1-ubyte" in names
    # What is not a journal mnist2db wrote stays (a cut-short JSON journal is mnist2db's).
    assert (JOURNAL in names) == (kind != "nested")
