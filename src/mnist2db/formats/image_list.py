"""Caffe's image list files (``convert_imageset``'s LISTFILE): ``PATH LABEL`` per line.

Caffe reads each line with ``std::getline``, splits it at its *last* space and takes the
label as ``atoi`` of the rest; the record's key is ``%08d_`` of the line's number (from 0)
followed by the path exactly as written. That reading turns common slips into silent
"file not found" for every line: a tab instead of a space, a trailing or doubled space.
This parser reads every line as its writer meant it, and refuses what has no meaning in
one line naming the list and the line:

* the line ends at ``\\n``; a ``\\r`` before it (CRLF) is dropped;
* the label is the last field, after the last run of spaces or tabs; spaces and tabs
  around the path are dropped (``"a.png\\t3"``, ``"a.png 3 "``, ``"a.png  3"`` all name
  ``a.png`` with label 3);
* the label is a whole number (an optional sign, digits) within int32, else refused
  (``atoi`` would make ``"cat"`` 0 and ``"3.5"`` 3);
* a blank line names no image: skipped, its number still counted, as Caffe counts it;
* a line with no label, or a path holding a NUL byte, is refused.

Every line Caffe reads as a path and a label, this reads the same way (the same path,
the same label, the same number), so the keys are Caffe's byte for byte.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import NamedTuple

from mnist2db.errors import ImageError, printable

#: LMDB's largest key (``mdb_env_get_maxkeysize``, 511 bytes in its default build).
KEY_LIMIT_LMDB = 511
_LABEL = re.compile(rb"[+-]?[0-9]+")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_BLANKS = b" \t"


class ListEntry(NamedTuple):
    """One image of a list: ``line`` (its number from 0, as in the key), ``path`` (bytes
    as written, relative to the root folder) and ``label``."""

    line: int
    path: bytes
    label: int


def image_key(entry: ListEntry) -> bytes:
    """Caffe's key of the record: ``%08d_`` of the line number, then the path."""
    return b"%08d_" % entry.line + entry.path


def _shown(text: bytes) -> str:
    return printable(repr(os.fsdecode(text))[1:-1])


def parse_line(raw: bytes, number: int, where: str) -> ListEntry | None:
    """Read line ``number`` (from 0) of the list ``where``: the entry, or None for a blank
    line.

    Raises:
        ImageError: the line has no label, a label that is not a whole number in int32,
            or a path with a NUL byte; the message names ``where`` and the line (from 1).
    """
    line = raw[:-1] if raw.endswith(b"\r") else raw
    # The usual line, "PATH DIGITS", read without the general rules below.
    path, space, label = line.rpartition(b" ")
    if (
        space
        and label.isdigit()
        and path
        and path[-1] not in _BLANKS
        and path[0] not in _BLANKS
        and len(label) < 10
        and b"\0" not in path
    ):
        return ListEntry(number, path, int(label))
    text = line.strip(b" \t")
    if not text:
        return None
    place = f"{where}:{number + 1}"
    split = max(text.rfind(b" "), text.rfind(b"\t"))
    if split < 0:
        raise ImageError(
            f"{place}: no label in {_shown(text)!r}: each line is 'PATH LABEL' (a space "
            "before the label)"
        )
    path = text[:split].rstrip(b" \t")
    label = text[split + 1 :]
    if _LABEL.fullmatch(label) is None:
        raise ImageError(
            f"{place}: the label {_shown(label)!r} is not a whole number: each line is "
            "'PATH LABEL', the label last"
        )
    value = int(label)
    if not _INT32[0] <= value <= _INT32[1]:
        raise ImageError(f"{place}: the label {value} does not fit a Datum's int32 label")
    if b"\0" in path:
        raise ImageError(f"{place}: the path holds a NUL byte")
    return ListEntry(number, path, value)


def read_image_list(path: str | os.PathLike[str]) -> Iterator[ListEntry]:
    """The entries of the list file at ``path``, in order, read as :func:`parse_line` reads
    each line. Streamed: one line in memory at a time.

    Raises:
        ImageError: the file cannot be read, or a line is refused (see :func:`parse_line`).
    """
    where = os.fspath(path)
    try:
        stream = open(where, "rb")  # noqa: SIM115 (closed below, also when abandoned)
    except OSError as exc:
        raise ImageError(f"{where}: cannot read the list: {exc.strerror}") from None
    with stream:
        number = 0
        while True:
            try:
                raw = stream.readline()
            except OSError as exc:
                raise ImageError(f"{where}: cannot read the list: {exc.strerror}") from None
            if not raw:
                return
            entry = parse_line(raw[:-1] if raw.endswith(b"\n") else raw, number, where)
            if entry is not None:
                yield entry
            number += 1
