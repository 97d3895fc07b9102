"""DirectWriter: whatever the pieces (empty, below a block, across the staging buffer, larger
than it), each file holds exactly their bytes, file after file with one writer; and where
the file system refuses a direct write, the same bytes buffered."""

from __future__ import annotations

import os
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.storage.direct_writes import ALIGN, DirectWriter


def _write_files(writer: DirectWriter, folder: Path, files: list[list[bytes]]) -> None:
    for index, pieces in enumerate(files):
        path = folder / f"{index}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            writer.start(fd)
            # Some pieces as views (the export hands views into the database's map).
            writer.write([memoryview(p) if i % 2 else p for i, p in enumerate(pieces)])
            writer.end()
        finally:
            os.close(fd)
        assert path.read_bytes() == b"".join(pieces)


# Piece sizes drawn; their bytes derived from (size, seed): no two pieces alike.
_pieces = st.lists(
    st.tuples(st.integers(0, 3 * 3 * ALIGN + 17), st.integers(0, 1 << 30)).map(
        lambda drawn: random.Random(drawn[1]).randbytes(drawn[0])
    ),
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(files=st.lists(_pieces, min_size=1, max_size=3))
def test_every_file_holds_exactly_its_pieces(tmp_path_factory, files):
    folder = tmp_path_factory.mktemp("direct")
    writer = DirectWriter(stage_size=3 * ALIGN)
    try:
        _write_files(writer, folder, files)
    finally:
        writer.close()


def test_a_refused_direct_write_writes_the_same_bytes_buffered(tmp_path):
    # Writes of 1000 bytes are not aligned: a file system that checks (ext4, XFS) refuses
    # them (EINVAL) and the writer goes on buffered; one that does not takes them as they are.
    writer = DirectWriter(stage_size=1000, align=1000)
    try:
        _write_files(writer, tmp_path, [[os.urandom(2500), os.urandom(10)], [os.urandom(7000)]])
    finally:
        writer.close()


def test_a_large_shard_of_many_pieces(tmp_path):
    pieces = [os.urandom(n) for n in (511, 1, 40000, 512, 5 << 20, 3, 4096, 4095)]
    writer = DirectWriter()
    try:
        _write_files(writer, tmp_path, [pieces, pieces[::-1]])
    finally:
        writer.close()
