"""A pipe's IDX header read ahead, its bytes then relayed on unchanged.

A pipe (``/dev/stdin``, a FIFO, ``<(zcat …)``) can be read only once. Caffe's
``convert_mnist_data`` checks both headers before writing a record; to do the same for a
pipe, :func:`peek_pipe` reads just enough of it to parse its header (through gzip or xz as
the content says), keeps every byte it consumed, and hands the converter a fresh pipe
(``/dev/fd/N``) that a thread fills with those bytes and then the rest, a chunk at a time:
memory stays bounded, nothing of the input is lost or changed.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator

from mnist2db.formats.idx import IdxHeader
from mnist2db.formats.idx_reader import READ_CHUNK, open_data, open_raw, parse_header


class _Recording(io.RawIOBase):
    """A pipe's reader that keeps every byte it delivers (the header's read-ahead)."""

    def __init__(self, raw: io.BufferedReader) -> None:
        super().__init__()
        self.raw = raw
        self.seen = bytearray()

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.raw.fileno()

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = os.read(self.raw.fileno(), len(buffer))
        buffer[: len(data)] = data
        self.seen += data
        return len(data)


def _relay(head: bytes, source: int, sink: int) -> None:
    """Write ``head`` then all of ``source`` to ``sink``; stop quietly when the reader
    has gone (the conversion failed and closed its end)."""
    try:
        view = memoryview(head)
        while view:
            view = view[os.write(sink, view) :]
        while chunk := os.read(source, READ_CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(sink, view) :]
    except OSError:
        pass
    finally:
        os.close(sink)
        os.close(source)


@contextlib.contextmanager
def peek_pipe(path: str) -> Iterator[tuple[IdxHeader, str]]:
    """``(header, relayed_path)`` of the pipe ``path``: its IDX header, and a path to read
    all of its bytes from, the header's included. The relay ends with the block.

    Raises:
        IdxFormatError: the pipe cannot be opened, or does not start with an IDX header
            (named by ``path``).
    """
    raw = open_raw(path)
    recording = _Recording(raw)
    try:
        stream, packing, _ = open_data(io.BufferedReader(recording, READ_CHUNK), path)
        header = parse_header(stream, path, packing)
        read_end, write_end = os.pipe()
        source = os.dup(raw.fileno())
    except BaseException:
        raw.close()
        raise
    raw.close()
    relay = threading.Thread(
        target=_relay, args=(bytes(recording.seen), source, write_end), daemon=True
    )
    relay.start()
    try:
        yield header, f"/dev/fd/{read_end}"
    finally:
        # Our copy of the read end closed: a relay still writing to a reader that stopped
        # early gets EPIPE and ends; one waiting on a slow producer ends with the process.
        os.close(read_end)
        relay.join(timeout=1.0)
