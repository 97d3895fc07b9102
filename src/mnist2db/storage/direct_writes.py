"""Large sequential files written past the page cache (``O_DIRECT``), through one aligned
staging buffer, for writers that flush what they write anyway (``export --to webdataset``'s
shards: each is fsynced before it is renamed into place).

Why: a buffered write copies every byte into page-cache pages the kernel must first find
and fill (on a virtual machine, memory the host gives back lazily: that copy ran at 0.4 to
2 GB/s here), and the fsync then writes them out. A direct write goes from the staging
buffer to the device; the bytes are copied once, into a buffer that stays warm. The file's
durability is unchanged: the caller still fsyncs it (for the device's cache and the
metadata) before it renames it.

Direct writes need aligned memory, offsets and lengths: the staging buffer is a page-aligned
map, and every direct write is a whole number of :data:`ALIGN` bytes from offset 0; the
tail (below :data:`ALIGN`) is written buffered at the end. A file system that refuses
``O_DIRECT`` (``EINVAL``, on setting the flag or on a write), or a short write, turns the
file back to ordinary buffered writes of the pieces as they are (``writev``): the bytes
are the same either way.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from typing import Any

#: Alignment of every direct write (memory, offset, length): 4096 covers 512- and
#: 4096-byte logical blocks.
ALIGN = 4096
#: The staging buffer: the size of each direct write.
STAGE_SIZE = 4 << 20
#: The most buffers one ``writev`` takes (Linux's IOV_MAX).
_IOV_MAX = 1024
_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectWriter:
    """Writes files one after another through one staging buffer (one thread uses it):
    :meth:`start` a file, :meth:`write` its pieces in order, :meth:`end` it (the tail);
    then the caller fsyncs and closes it. Start the next file only after :meth:`end`."""

    def __init__(self, stage_size: int = STAGE_SIZE, align: int = ALIGN) -> None:
        # stage_size, a multiple of align: each direct write's size (smaller in tests).
        self.stage_size, self.align = stage_size, align
        self.stage = mmap.mmap(-1, stage_size)
        self.view = memoryview(self.stage)
        self.fd = -1
        self.held = 0  # bytes staged, not written yet
        self.direct = False

    def start(self, fd: int) -> None:
        """Write ``fd`` (empty, opened for writing) from now on; direct where the file
        system takes it."""
        self.fd, self.held = fd, 0
        self.direct = False
        if _DIRECT:
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _DIRECT)
                self.direct = True
            except OSError:
                pass  # not on this file system: buffered writes

    def write(self, buffers: list[Any]) -> None:
        """Append ``buffers`` (bytes-like) to the file."""
        if not self.direct:
            _writev_all(self.fd, buffers)
            return
        stage, view = self.stage_size, self.view
        for i, buffer in enumerate(buffers):
            held, size = self.held, len(buffer)  # bytes, or a view of bytes ("B")
            if held + size < stage:  # most pieces: staged whole
                view[held : held + size] = buffer
                self.held = held + size
                continue
            piece = memoryview(buffer).cast("B")
            while piece:
                n = min(len(piece), stage - self.held)
                view[self.held : self.held + n] = piece[:n]
                self.held += n
                piece = piece[n:]
                if self.held == stage:
                    self._write_staged(stage)
                    if not self.direct:  # fell back: the rest as it is
                        _writev_all(self.fd, [piece, *buffers[i + 1 :]])
                        return

    def end(self) -> None:
        """Write what is staged: the aligned part directly, the tail buffered."""
        if not self.direct:
            return
        aligned = self.held - self.held % self.align
        if aligned:
            self._write_staged(aligned)
        if self.held:
            self._buffered()
            _writev_all(self.fd, [self.view[: self.held]])
            self.held = 0

    def _write_staged(self, size: int) -> None:
        """Write the first ``size`` staged bytes (a multiple of ``align``) directly,
        keep the rest staged; on a refusal or a short write, write them buffered."""
        done = 0
        try:
            done = os.write(self.fd, self.view[:size])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        if done < size:  # refused, or short (the disk filling): buffered from here
            self._buffered()
            _writev_all(self.fd, [self.view[done : self.held]])
            self.held = 0
            return
        rest = self.held - size
        self.view[:rest] = self.view[size : self.held]  # under align bytes: never overlapping
        self.held = rest

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_DIRECT)
        self.direct = False

    def close(self) -> None:
        self.view.release()
        with contextlib.suppress(BufferError):  # a view still held: the map goes with it
            self.stage.close()


def _writev_all(fd: int, buffers: list[Any]) -> None:
    """Write ``buffers`` in order (``writev``, at most IOV_MAX at a time, a short write
    finished piece by piece)."""
    for start in range(0, len(buffers), _IOV_MAX):
        chunk = buffers[start : start + _IOV_MAX]
        written = os.writev(fd, chunk)
        if written < sum(map(len, chunk)):
            for buffer in chunk:
                view = memoryview(buffer)
                if written >= len(view):
                    written -= len(view)
                    continue
                view, written = view[written:], 0
                while view:
                    view = view[os.write(fd, view) :]
