"""One pass over an IDX file that measures it without failing on what is wrong after its
header (what ``info`` reports): the sizes found, a label histogram, the first problem.
It opens the file as every reader does (:mod:`mnist2db.formats.idx.reader`)."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from mnist2db.formats.idx.header import LABELS_MAGIC, IdxHeader, size_error
from mnist2db.formats.idx.reader import (
    CORRUPT_ERRORS,
    READ_CHUNK,
    corrupt_stream,
    open_data,
    open_raw,
    parse_header,
)


class IdxScan(NamedTuple):
    """What one pass over an IDX file finds (:func:`scan_idx`)."""

    header: IdxHeader
    file_size: int
    data_size: int  # bytes of data found after the header (decompressed for gzip)
    problem: str | None
    label_counts: dict[int, int] | None = None
    at_least: bool = False  # reading stopped one chunk past the declared size
    streaming: bool = False  # a pipe: no size known beforehand


def scan_idx(path: str | os.PathLike[str]) -> IdxScan:
    """Measure an IDX file without failing on what is wrong after its header (``info``).

    The file is read through once (a chunk at a time) when it is compressed, a label file
    or a pipe, to measure its data and count labels; a plain image file is measured by its
    size. Reading stops one chunk past the declared size, as ``convert`` does, so a
    decompression bomb is reported as holding "at least" that much.

    Raises:
        IdxFormatError: the file cannot be read or its header cannot be parsed at all.
    """
    path = os.fspath(path)
    with open_raw(path) as raw:
        file_size = os.fstat(raw.fileno()).st_size
        stream, packing, streaming = open_data(raw, path)
        header = parse_header(stream, path, packing)
        compressed = packing != "plain"
        counts = np.zeros(256, dtype=np.int64) if header.magic == LABELS_MAGIC else None
        problem = None
        at_least = False
        if not compressed and counts is None and not streaming:
            data_size = file_size - header.header_size
        else:
            data_size = 0
            limit = header.payload_size + READ_CHUNK
            try:
                while chunk := stream.read(min(READ_CHUNK, limit - data_size)):
                    if counts is not None:
                        room = max(0, header.payload_size - data_size)
                        counts += np.bincount(
                            np.frombuffer(chunk[:room], dtype=np.uint8), minlength=256
                        )
                    data_size += len(chunk)
                    if data_size >= limit:
                        at_least = True
                        break
            except (*CORRUPT_ERRORS, OSError) as exc:
                problem = f"{corrupt_stream(stream)} after {data_size} bytes of data: {exc}"
        if streaming and not compressed:
            file_size = header.header_size + data_size
    if problem is None and data_size != header.payload_size:
        problem = str(size_error(header, data_size, at_least=at_least)).removeprefix(f"{path}: ")
    label_counts = (
        {int(v): int(n) for v, n in enumerate(counts) if n} if counts is not None else None
    )
    return IdxScan(header, file_size, data_size, problem, label_counts, at_least, streaming)
