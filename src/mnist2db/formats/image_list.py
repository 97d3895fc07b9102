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
* a line with no label, or a path holding a NUL byte, is refused;
* a line longer than :data:`MAX_LINE` bytes is refused when that much has been read (a
  list that is one endless line, ``/dev/zero``, is never held in memory).

A list may be a pipe (``<(...)``, ``/dev/stdin``): :class:`ImageList` reads it once and keeps
its lines in an unlinked temporary file for the passes after the first. What mnist2db
writes as a list (:func:`list_line`) reads back as the same entries, or is refused.

Every line Caffe reads as a path and a label, this reads the same way (the same path,
the same label, the same number), so the keys are Caffe's byte for byte.
"""

from __future__ import annotations

import array
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator

from mnist2db.errors import ImageError
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.datum import KEY_LIMIT
from mnist2db.formats.text_lines import BLANKS, bounded_lines, shown

if TYPE_CHECKING:
    from typing import IO

_LABEL = re.compile(rb"[+-]?[0-9]+")
_INT32 = (-(1 << 31), (1 << 31) - 1)
#: The longest line read: far past any path the system opens (PATH_MAX, 4096 bytes).
MAX_LINE = 1 << 16
#: The most lines a list may have: Caffe's keys (``%08d_``) hold 10^8.
MAX_LINES = KEY_LIMIT


@named_tuple
class ListEntry(NamedTuple):
    """One image of a list: ``line`` (its number from 0, as in the key), ``path`` (bytes
    as written, relative to the root folder) and ``label``."""

    line: int
    path: bytes
    label: int

    def __reduce__(self) -> tuple[type, tuple[int, bytes, int]]:
        # Pickled as the class and its fields (the workers' tasks): half the cost of
        # the namedtuple's own __getnewargs__ route.
        return (ListEntry, (self.line, self.path, self.label))


def image_key(entry: ListEntry) -> bytes:
    """Caffe's key of the record: ``%08d_`` of the line number, then the path."""
    return b"%08d_" % entry.line + entry.path


#: A ListEntry made from its fields' tuple by tuple's own constructor (the namedtuple's
#: __new__ is a Python function: a quarter of the time of reading a usual line).
_entry = tuple.__new__


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
        and path[-1] not in BLANKS
        and path[0] not in BLANKS
        and len(label) < 10
        and b"\0" not in path
    ):
        return _entry(ListEntry, (number, path, int(label)))
    text = line.strip(b" \t")
    if not text:
        return None
    place = f"{where}:{number + 1}"
    split = max(text.rfind(b" "), text.rfind(b"\t"))
    if split < 0:
        raise ImageError(
            f"{place}: no label in {shown(text)!r}: each line is 'PATH LABEL' (a space "
            "before the label)"
        )
    path = text[:split].rstrip(b" \t")
    label = text[split + 1 :]
    if _LABEL.fullmatch(label) is None:
        raise ImageError(
            f"{place}: the label {shown(label)!r} is not a whole number: each line is "
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
    each line. Streamed: one line (at most :data:`MAX_LINE` bytes) in memory at a time.
    Read once; :class:`ImageList` reads a list as often as asked, a pipe included.

    Raises:
        ImageError: the file cannot be read, or a line is refused (see :func:`parse_line`).
    """
    where = os.fspath(path)
    with _open_list(where) as stream:
        yield from _entries(stream, where)


def _open_list(where: str) -> IO[bytes]:
    try:
        return open(where, "rb")  # noqa: SIM115 (closed by the caller)
    except OSError as exc:
        raise ImageError(f"{where}: cannot read the list: {exc.strerror}") from None


def _lines(stream: IO[bytes], where: str) -> Iterator[bytes]:
    """The lines of ``stream``, ``\n`` kept, each at most :data:`MAX_LINE` bytes."""
    lines = bounded_lines(
        stream,
        where,
        limit=MAX_LINE,
        reading="the list",
        too_long=f"longer than {MAX_LINE} bytes: not a 'PATH LABEL' line (is it a list?)",
    )
    for number, raw in enumerate(lines, 1):
        if number > MAX_LINES:
            raise ImageError(
                f"{where}: more than {MAX_LINES} lines: Caffe's keys (%08d_PATH) hold {MAX_LINES}"
            )
        yield raw


def _entries(stream: IO[bytes], where: str) -> Iterator[ListEntry]:
    for number, raw in enumerate(_lines(stream, where)):
        entry = parse_line(raw[:-1] if raw.endswith(b"\n") else raw, number, where)
        if entry is not None:
            yield entry


class ImageList:
    """The list file at ``path`` as a source of its entries, read as often as it is called
    (a conversion reads its list to check it, then to write it). A regular file is read
    again each time, streamed; anything else (a pipe, ``<(...)``, ``/dev/stdin``, a FIFO),
    which a second read would find empty, is read once, its lines copied to an unlinked
    temporary file (nothing left behind, even after a kill) that later calls read."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.where = os.fspath(path)
        self._copy: IO[bytes] | None = None

    def __call__(self) -> Iterator[ListEntry]:
        if self._copy is None:
            stream = _open_list(self.where)
            try:
                regular = stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
                if regular:
                    stream.close()
                    return read_image_list(self.where)
                self._copy = self._keep(stream)
            finally:
                stream.close()
        return self._reread(self._copy)

    def _keep(self, stream: IO[bytes]) -> IO[bytes]:
        copy = tempfile.TemporaryFile()  # noqa: SIM115 (held until this list is dropped)
        try:
            for raw in _lines(stream, self.where):
                copy.write(raw)
            copy.flush()
        except OSError as exc:
            copy.close()
            raise ImageError(
                f"{self.where}: cannot keep a copy of the list ({tempfile.gettempdir()}): "
                f"{exc.strerror}"
            ) from None
        except BaseException:
            copy.close()
            raise
        return copy

    def _reread(self, copy: IO[bytes]) -> Iterator[ListEntry]:
        copy.seek(0)
        yield from _entries(copy, self.where)

    def open_bytes(self) -> IO[bytes]:
        """The list's bytes as a file of their own, at its start: a regular file's, or
        the copy kept of a pipe's (read and kept here, once).

        Raises:
            ImageError: the list cannot be read.
        """
        self()
        if self._copy is None:
            return _open_list(self.where)
        stream = os.fdopen(os.dup(self._copy.fileno()), "rb")
        stream.seek(0)
        return stream

    def close(self) -> None:
        """Drop the temporary copy (also when this list is garbage collected)."""
        if self._copy is not None:
            self._copy.close()
            self._copy = None

    def __del__(self) -> None:
        self.close()


class ListIndex:
    """The entries of an :class:`ImageList` held as an index, not as entries: the byte offset
    of each entry's line (8 bytes an entry), so that they can be read again in any order (a
    shuffle of 1.28 million lines holds 10 MB, not every path a second time). Built in one
    pass, which checks every line as :func:`read_image_list` does.

    Raises:
        ImageError: the list cannot be read, or a line is refused.
    """

    def __init__(self, image_list: ImageList) -> None:
        self.where = image_list.where
        self._list = image_list
        self._starts = array.array("q")
        with self._open() as stream:
            offset = 0
            for number, raw in enumerate(_lines(stream, self.where)):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                if parse_line(line, number, self.where) is not None:
                    self._starts.append(offset)
                offset += len(raw)

    def __len__(self) -> int:
        return len(self._starts)

    def entries(self, order: Iterable[int]) -> Iterator[ListEntry]:
        """Entry ``order[k]`` (counting entries from 0) as entry ``k``: numbered ``k``, its
        path and label read again from the list."""
        starts, where = self._starts, self.where
        with self._open() as stream:
            fd = stream.fileno()
            end = os.fstat(fd).st_size
            last = len(starts) - 1
            for number, i in enumerate(order):
                start = starts[i]
                size = min((starts[i + 1] if i < last else end) - start, MAX_LINE + 1)
                try:
                    raw = os.pread(fd, size, start).split(b"\n", 1)[0]
                except OSError as exc:
                    raise ImageError(f"{where}: cannot read the list: {exc.strerror}") from None
                entry = parse_line(raw, number, where)
                if entry is None:  # the list changed since it was indexed
                    raise ImageError(f"{where}: changed while it was read (a line is blank)")
                yield entry

    def _open(self) -> IO[bytes]:
        return self._list.open_bytes()


def listable(path: bytes) -> bool:
    """Whether a list line can name ``path``: :func:`parse_line` reads ``PATH 0`` back as
    ``path`` (no newline, NUL, or space or tab at an end)."""
    if b"\n" in path:
        return False
    try:
        back = parse_line(path + b" 0", 0, "")
    except ImageError:
        return False
    return back is not None and back.path == path


def list_line(entry: ListEntry) -> bytes:
    """The line of a list that names ``entry``: ``PATH LABEL\n``, read back by
    :func:`parse_line` as the same path and label.

    Raises:
        ImageError: no list line can name the path (see :func:`listable`), naming it.
    """
    if not listable(entry.path):
        raise ImageError(
            f"{shown(entry.path)}: a name no list line can hold (a newline, or a space or "
            "tab at an end): rename it, or hide it with a leading '.'"
        )
    return entry.path + b" %d\n" % entry.label
