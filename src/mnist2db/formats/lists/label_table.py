"""Label tables: files that give each image several numbers (multi-label tags, attributes,
regression targets), read as rows of ``path`` and ``N`` values.

Two layouts:

* a **value list**, Caffe's list file with more than one value after the path
  (``img.jpg 0 1 1 0``, ``img.jpg 0.25 -3.5 17``): with ``N`` values a line, the path is
  everything before the last ``N`` fields (so a path holding spaces works, as Caffe's
  last-space rule does for one label); ``N`` is given, or taken from the first line (its
  numeric fields after the first);
* a **table with a header**: ``path,smiling,young,...`` (CSV, split at commas; quotes are
  not read) or the same split at spaces and tabs; or CelebA's ``list_attr_celeba.txt``
  layout, read as it is: a line holding the row count, a line of the ``N`` names, then
  ``name v1 … vN`` rows.

Every row must hold ``N`` values; each value is a decimal number (``-1``, ``0.25``,
``1e-3``) that fits a float32. Anything else is refused in one line naming the file and
the line: another count, a value that is not a number, NaN or infinity, a value beyond
float32's range, an empty path, a NUL byte, a line longer than :data:`MAX_LINE` bytes.
Rows are streamed: one line in memory at a time, whatever the count; a width over
:data:`MAX_VALUES` is refused before any row is read. Line endings as in
:mod:`mnist2db.formats.lists.image_list`: ``\\n``, a ``\\r`` before it dropped; a blank line is
skipped, its number counted (a value list's keys are Caffe's ``%08d_PATH`` of the line).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from mnist2db.errors import ImageError
from mnist2db.formats.lists.text_lines import BLANKS, bounded_lines, shown

#: The most values a row may hold: a record of 5 bytes a value (float_data, unpacked),
#: 5 MiB at this width, far beyond any label vector (CelebA: 40; landmarks: tens).
MAX_VALUES = 1 << 20
#: The longest line read (bytes): a full-width row of long decimals fits.
MAX_LINE = 64 << 20
#: The largest float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The smallest magnitude a double rounds to float32's infinity (halfway from FLT_MAX to
#: 2^128, rounded to even): below it, a value (``3.4028235e+38``, as ``export`` prints
#: FLT_MAX) is stored as the nearest float32.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103

LAYOUTS = ("list", "csv", "whitespace", "celeba")


class TargetRow(NamedTuple):
    """One row: ``line`` (its number from 0 among the rows, blank lines counted: a value
    list's line number, as in Caffe's keys), ``path`` (bytes as written) and ``values``
    (a float32 array of the table's width)."""

    line: int
    path: bytes
    values: np.ndarray


class LabelTable(NamedTuple):
    """A label file's shape, read from its head: ``path``, ``layout`` (one of
    :data:`LAYOUTS`), ``width`` (values a row), ``names`` (the header's column names, or
    ``()``), ``skip`` (lines before the first row) and ``promised`` (rows the file promises:
    CelebA's first line; else None), ``inferred`` (a value list's width taken from its
    first line: a later path ending in a number then means a line of more values, refused).
    :func:`iter_rows` streams its rows."""

    path: str
    layout: str
    width: int
    names: tuple[str, ...]
    skip: int
    promised: int | None
    inferred: bool = False


def first_label(values: np.ndarray) -> int:
    """The image record's own ``label``: the first value when it is a whole number within
    int32 (a class index, a 0/1 tag), else 0 (a regression target)."""
    first = float(values[0]) if len(values) else 0.0
    if first.is_integer() and -(2**31) <= first < 2**31:
        return int(first)
    return 0


def _is_number(field: bytes) -> bool:
    try:
        value = float(field)
    except ValueError:
        return False
    return b"_" not in field and math.isfinite(value)


def check_width(width: int, where: str) -> None:
    """Refuse a row width below 1 or above :data:`MAX_VALUES`, before any row is read.

    Raises:
        ImageError: naming ``where`` and the width.
    """
    if not 1 <= width <= MAX_VALUES:
        raise ImageError(
            f"{where}: {width} values a row; a label row holds 1 to {MAX_VALUES} values"
        )


def _lines(where: str, skip: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(number from 0, line without its ending)`` of the file, bounded by :data:`MAX_LINE`."""
    try:
        stream = open(where, "rb")  # noqa: SIM115 (closed below, also when abandoned)
    except OSError as exc:
        raise ImageError(f"{where}: cannot read the labels: {exc.strerror}") from None
    with stream:
        lines = bounded_lines(
            stream,
            where,
            limit=MAX_LINE,
            reading="the labels",
            too_long=f"the line is longer than {MAX_LINE} bytes",
        )
        for number, raw in enumerate(lines):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            line = line[:-1] if line.endswith(b"\r") else line
            if number >= skip:
                yield number - skip, line


def _check_regular(where: str) -> None:
    """Refuse, without opening it (a FIFO would block), anything but a regular file: a
    table is read more than once (its head, a check, the records)."""
    try:
        mode = os.stat(where).st_mode
    except OSError as exc:
        raise ImageError(f"{where}: cannot read the labels: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a pipe or device"
        raise ImageError(
            f"{where}: not a regular file ({kind}): a label table is read more than once; "
            "save it to a file first"
        )


def _split_header(line: bytes) -> list[bytes]:
    if b"," in line:
        return [field.strip(BLANKS) for field in line.split(b",")]
    return line.split()


def open_label_table(
    path: str | os.PathLike[str], *, header: bool = True, width: int | None = None
) -> LabelTable:
    """Read a label file's head: its layout, width and names (the rows are streamed by
    :func:`iter_rows`).

    Args:
        header: True: a table with a header row (CSV, whitespace, or CelebA's layout,
            told apart by the first line); False: a value list (``PATH v1 … vN``).
        width: a value list's ``N`` (None: the numeric fields after the first field of
            its first line). With a header, the header gives it.

    Raises:
        ImageError: the file cannot be read, is empty, or its head is malformed.
    """
    where = os.fspath(path)
    if width is not None:
        check_width(width, where)
    _check_regular(where)
    head: list[tuple[int, bytes]] = []
    for number, line in _lines(where):
        if line.strip(BLANKS) or header:
            head.append((number, line))
        if len(head) == 2 or (head and not header):
            break
    if not head:
        raise ImageError(f"{where}: no rows: the file is empty")
    if not header:
        if width is None:
            fields = head[0][1].split()
            width = 0
            for field in reversed(fields[1:]):
                if not _is_number(field):
                    break
                width += 1
            if not width:
                raise ImageError(
                    f"{where}:{head[0][0] + 1}: no values after the path: each line is "
                    "'PATH V1 … VN'"
                )
            check_width(width, where)
            return LabelTable(where, "list", width, (), 0, None, inferred=True)
        return LabelTable(where, "list", width, (), 0, None)
    first = head[0][1].strip(BLANKS)
    if first.isdigit() and len(head) == 2:
        names = tuple(os.fsdecode(n) for n in head[1][1].split())
        check_width(len(names), f"{where}:2")
        return LabelTable(where, "celeba", len(names), names, 2, int(first))
    fields = _split_header(first)
    layout = "csv" if b"," in first else "whitespace"
    if len(fields) < 2 or not all(fields):
        raise ImageError(
            f"{where}:1: the header {shown(first[:80])!r} names no label columns: "
            "expected 'path,name1,name2,…' (or a CelebA count line, then the names)"
        )
    check_width(len(fields) - 1, f"{where}:1")
    if _is_number(fields[-1]):  # a row of values, not a header of names
        raise ImageError(
            f"{where}:1: the first line ends in a number, not a column name: a label table "
            "begins with a header row (a list of PATH V1 … VN lines: --list with --values)"
        )
    names = tuple(os.fsdecode(n) for n in fields[1:])
    return LabelTable(where, layout, len(names), names, 1, None)


def iter_rows(table: LabelTable) -> Iterator[TargetRow]:
    """The rows of ``table``, in file order, each checked (see the module docstring).

    Raises:
        ImageError: a row is refused (naming the file and the line from 1), or a CelebA
            table holds another number of rows than its first line says.
    """
    where, width, skip = table.path, table.width, table.skip
    comma = table.layout == "csv"
    # A whitespace row's path is what precedes the last ``width`` fields.
    rows = 0
    for number, line in _lines(where, skip):
        text = line.strip(BLANKS)
        if not text:
            continue
        place = f"{where}:{number + skip + 1}"
        # A table's fields are counted before a path is taken (a row of one value too
        # many would otherwise give a path with the value glued to it); a value list's
        # path is what precedes its last ``width`` fields (a path may hold spaces).
        if comma:
            parts = [field.strip(BLANKS) for field in text.split(b",")]
        elif table.layout == "list":
            parts = text.rsplit(None, width)
        else:
            parts = text.split()
        path, fields = parts[0], parts[1:]
        if len(fields) != width:
            split = {"csv": "a comma", "list": ""}.get(table.layout, "a space")
            hint = (
                f" (a path holding {split} cannot be told from a value in this layout)"
                if split and len(fields) > width
                else ""
            )
            raise ImageError(
                f"{place}: {len(fields)} values after the path, expected {width}: every "
                f"line holds a path and the same number of values{hint}"
            )
        if not path:
            raise ImageError(f"{place}: no path before the values")
        words = path.split()
        if table.inferred and len(words) > 1 and _is_number(words[-1]):
            raise ImageError(
                f"{place}: more than {width} values after the path "
                f"({shown(path)!r} ends in a number); every line holds the same number"
            )
        if b"\0" in path:
            raise ImageError(f"{place}: the path holds a NUL byte")
        yield TargetRow(number, path, _values(fields, place))
        rows += 1
    if table.promised is not None and rows != table.promised:
        raise ImageError(
            f"{where}: {rows} rows, but its first line says {table.promised} (a file cut short?)"
        )


def _values(fields: list[bytes], place: str) -> np.ndarray:
    try:
        values = np.array([float(f) for f in fields], np.float64)
        bad = not np.isfinite(values).all() or any(b"_" in f for f in fields)
    except ValueError:
        bad = True
    if bad or (len(values) and float(np.abs(values).max()) >= FLOAT32_OVERFLOW):
        for i, field in enumerate(fields):
            try:
                value = float(field)
            except ValueError:
                value = None
            if value is None or b"_" in field:
                what = "is not a number"
            elif math.isnan(value):
                what = "is NaN"
            elif math.isinf(value):
                what = "is infinite"
            elif abs(value) >= FLOAT32_OVERFLOW:
                what = "does not fit a float32 (at most ±3.4e38)"
            else:
                continue
            raise ImageError(f"{place}: value {i + 1}, {shown(field[:40])!r}, {what}")
    return values.astype(np.float32)
