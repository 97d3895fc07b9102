"""AtomicFile: nothing under the final name until commit; the umask's mode after it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mnist2db.fsutil import AtomicFile, mkdtemp_beside


def test_uncommitted_file_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), AtomicFile(str(target)) as f:
        f.stream.write(b"partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_commit_replaces_with_umask_mode(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    old = os.umask(0o027)
    try:
        with AtomicFile(str(target)) as f:
            f.stream.write(b"new")
            assert target.read_bytes() == b"old"
            f.commit()
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_mkdtemp_beside_is_private_and_unique(tmp_path: Path) -> None:
    first = mkdtemp_beside(str(tmp_path), ".x-")
    second = mkdtemp_beside(str(tmp_path), ".x-")
    assert first != second
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o700
    assert os.path.basename(first).startswith(".x-")
