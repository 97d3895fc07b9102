"""Whole reads and writes on the pipes between an export and the process it forks
(:mod:`~mnist2db.exporting.png_worker`, :mod:`~mnist2db.exporting.image_files.file_writer`)."""

from __future__ import annotations

import os


def read_exact(fd: int, size: int, what: str) -> bytes:
    """``size`` bytes from ``fd``; EOFError naming ``what`` when it ends first."""
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError(f"{what}'s pipe ended")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """All of ``data`` to ``fd``, however many writes it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
