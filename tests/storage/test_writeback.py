"""The LMDB writer lets go of the page cache behind it (the file's pages more than
``LMDB_CACHE_KEPT`` before its end, once on disk): the kernel then reuses those pages for
the next writes instead of fresh memory. The records are the same either way."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import lmdb
import pytest

from mnist2db.imageset.to_database import release_mapped_pages
from mnist2db.storage.databases import writers
from mnist2db.storage.databases.writers import LmdbWriter

PAGE = mmap.PAGESIZE


def cached_pages(path: Path, length: int) -> int:
    """How many of the first ``length`` bytes' pages of ``path`` are in the page cache."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    pages = (length + PAGE - 1) // PAGE
    vector = ctypes.create_string_buffer(pages)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), length, access=mmap.ACCESS_COPY) as m:
        start = ctypes.c_char.from_buffer(m)  # the mapping's address; nothing is read
        failed = libc.mincore(ctypes.addressof(start), length, vector) != 0
        del start
    if failed:
        pytest.skip(f"mincore: {os.strerror(ctypes.get_errno())}")
    return sum(b & 1 for b in vector.raw)


def records(count: int, size: int) -> list[tuple[bytes, bytes]]:
    return [(b"%08d" % i, bytes([i % 251]) * size) for i in range(count)]


@pytest.mark.skipif(sys.platform != "linux", reason="sync_file_range and fadvise: Linux")
@pytest.mark.parametrize("kept", [0, None])
def test_pages_behind_the_writer_leave_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: int | None
) -> None:
    if kept is not None:
        monkeypatch.setattr(writers, "LMDB_CACHE_KEPT", kept)
    else:
        monkeypatch.setattr(writers, "LMDB_CACHE_KEPT", 1 << 40)  # nothing let go
    items = records(96, 200_000)  # ~19 MiB of overflow pages
    writer = LmdbWriter(str(tmp_path), 64 << 20)
    for start in range(0, len(items), 8):
        writer.write_batch(items[start : start + 8])
        release_mapped_pages(os.path.realpath(tmp_path / "data.mdb"))  # as the imageset does
    data = tmp_path / "data.mdb"
    first = 8 << 20
    cached = cached_pages(data, first)
    writer.close()
    if kept is None:
        # All kept, but for what the kernel's own reclaim took when the machine's memory
        # was full of page cache (a CI run once saw 2044 of 2048 pages).
        assert cached > first // PAGE * 3 // 4
    else:
        assert cached < first // PAGE // 4  # let go (a page LMDB read again may be back)
    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    with env.begin() as txn:
        assert list(txn.cursor()) == items
    env.close()
