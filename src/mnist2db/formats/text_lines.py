"""The line reader of the text files mnist2db reads (image lists, label tables): one line
in memory at a time, a bound on its length, and a failure as one line naming the file.

A line longer than its bound is refused as soon as that much of it has been read, so a
file that is one endless line (``/dev/zero``, ``yes | tr -d '\\n'``) is never held in
memory. What a line means is its format's (:mod:`mnist2db.formats.image_list`,
:mod:`mnist2db.formats.label_table`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from mnist2db.errors import ImageError, printable
from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import IO

#: The blanks that separate a line's fields: spaces and tabs.
BLANKS = b" \t"


def bounded_lines(
    stream: IO[bytes], where: str, *, limit: int, reading: str, too_long: str
) -> Iterator[bytes]:
    """The lines of ``stream``, each with its ``\\n`` (the last may lack one).

    Raises:
        ImageError: ``WHERE: cannot read READING: ...`` when reading fails;
            ``WHERE:N: TOO_LONG`` (``N`` the line's number from 1) for a line of more than
            ``limit`` bytes, its ``\\n`` not counted.
    """
    number = 0
    while True:
        try:
            raw = stream.readline(limit + 1)
        except OSError as exc:
            raise ImageError(f"{where}: cannot read {reading}: {exc.strerror}") from None
        if not raw:
            return
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise ImageError(f"{where}:{number}: {too_long}")
        yield raw


def shown(text: bytes) -> str:
    """Bytes of a line (a path, a field) as a message shows them: printable, escaped."""
    return printable(repr(os.fsdecode(text))[1:-1])
