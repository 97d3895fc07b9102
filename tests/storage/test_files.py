"""AtomicFile: nothing under the final name until commit; the umask's mode after it."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
from os_helpers import dead_pid, mounted_tmpfs

from mnist2db.storage.files import AtomicFile, mkdtemp_beside, remove_stale, temp_prefix


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


def test_stale_temporaries_of_dead_runs_are_removed(tmp_path: Path) -> None:
    dead = dead_pid()
    stale = tmp_path / f".out.bin.mnist2db-tmp-{dead}-ab12_cd"
    stale_png = tmp_path / f".out.bin.mnist2db-tmp-{dead}-zz99.png"
    live = tmp_path / ".out.bin.mnist2db-tmp-1-ab12cd"  # pid 1 is alive
    other = tmp_path / f".other.bin.mnist2db-tmp-{dead}-ab12cd"
    odd = tmp_path / f".out.bin.mnist2db-tmp-{dead}-NOT-OURS"
    for path in (stale, stale_png, live, other, odd):
        path.write_bytes(b"x")
    removed = remove_stale(
        str(tmp_path), temp_prefix("out.bin"), directories=False, extensions=(".png",)
    )
    assert sorted(removed) == sorted([str(stale), str(stale_png)])
    assert not stale.exists() and not stale_png.exists()
    assert live.exists() and other.exists() and odd.exists()


def test_atomic_file_clears_its_own_stale_temporaries(tmp_path: Path) -> None:
    stale = tmp_path / f".out.bin.mnist2db-tmp-{dead_pid()}-ab12cd"
    stale.write_bytes(b"left by a killed run")
    with AtomicFile(str(tmp_path / "out.bin")) as f:
        f.stream.write(b"new")
        f.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_temp_prefix_hashes_long_names() -> None:
    assert temp_prefix("a.png") == ".a.png.mnist2db-tmp-"
    long = temp_prefix("x" * 200)
    assert long.startswith(".") and long.endswith(".mnist2db-tmp-") and len(long) == 1 + 32 + 14


def test_discard_unlinks_even_when_closing_fails(tmp_path: Path) -> None:
    """On a full disk close() flushes, fails, and the temporary is still unlinked."""
    with mounted_tmpfs(tmp_path / "small", "1m") as mount:
        target = mount / "out.bin"
        with pytest.raises(OSError) as info, AtomicFile(str(target)) as f:
            f.write(b"x" * 100_000)  # buffered: fits
            f.write(bytes(2 << 20))  # does not
        assert info.value.filename == str(target)  # the file, not its directory
        assert info.value.strerror == "No space left on device"
        assert os.listdir(mount) == []
        # Fill the disk; then a few buffered bytes fail only when close() flushes them.
        with (mount / "filler").open("wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(bytes(4096))

        with AtomicFile(str(target)) as f:
            f.stream.write(b"pending")  # in the buffer, not yet on the full disk
        assert os.listdir(mount) == ["filler"]


def test_make_parents_reports_and_removes_what_it_made(tmp_path: Path) -> None:
    from mnist2db.storage.files import make_parents, remove_made

    (tmp_path / "a").mkdir()
    made = make_parents(str(tmp_path / "a" / "b" / "c"))
    assert made == [str(tmp_path / "a" / "b"), str(tmp_path / "a" / "b" / "c")]
    assert make_parents(str(tmp_path / "a" / "b" / "c")) == []
    (tmp_path / "a" / "b" / "someone-else").write_text("x")
    remove_made(made)  # c goes; b holds another's file: kept, and a was never ours
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["someone-else"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        make_parents(str(tmp_path / "file" / "d" / "e"))
