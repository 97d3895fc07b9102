"""Whole reads and writes on the pipes between an export and the process it forks
(:mod:`~mnist2db.exporting.png_worker`, :mod:`~mnist2db.exporting.file_writer`)."""

from __future__ import annotations

import contextlib
import fcntl
import os

#: The size asked for each pipe (Linux's default is 64 KiB: a batch would take a write and a
#: wake-up of the other side every 16 pages; 1 MiB is the default limit for a process).
PIPE_SIZE = 1 << 20


def widen_pipes(*fds: int) -> None:
    """Ask for :data:`PIPE_SIZE` bytes of pipe behind each of ``fds`` (where the system
    allows: an unprivileged process is held to ``/proc/sys/fs/pipe-max-size``, and a refusal
    leaves the pipe as it was)."""
    for fd in fds:
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


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
