"""Every exception the library raises on purpose, declared in this one block.

One root, :class:`Mnist2dbError`; each subclass's docstring is the hint a caller needs.
Each message is one line naming the file, what was expected and what was found.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` as it can be printed: a path's bytes that are not UTF-8 (which Python holds
    as surrogates, ``\\udce9``) shown as the bytes they are, ``\\xe9``. The one place that
    does it: every library message passes through it, and the CLI's own path lines."""
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if not shown.isprintable():  # an escape sequence or a tab in a path: made inert
        shown = "".join(c if c.isprintable() or c == "\n" else f"\\x{ord(c):02x}" for c in shown)
    if "\\udc" not in shown:
        return shown  # the usual case, without importing re on the fast path
    import re

    # A message that quoted such a path with repr() already spells the surrogate out.
    return re.sub(r"\\udc([89a-f][0-9a-f])", r"\\x\1", shown)


def backend_message(exc: BaseException) -> str:
    """A backend's message as text (plyvel gives ``b'...'`` bytes), on one line."""
    arg = exc.args[0] if exc.args else exc
    text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
    return " ".join(text.split())


class Mnist2dbError(Exception):
    """Root of every error mnist2db raises on purpose; its message is one line for the user."""

    def __str__(self) -> str:
        # One line, whatever a path in it holds.
        return printable(super().__str__()).replace("\n", "\\x0a")


class IdxFormatError(Mnist2dbError):
    """An IDX file is missing, unreadable, or not what its header promises."""


class ArgumentError(Mnist2dbError, ValueError):
    """An argument's value is outside what is accepted (a batch size below 1, a negative
    offset, an out-of-range seed, an empty path, an unknown name); also a ValueError."""


class OutputError(Mnist2dbError):
    """An output cannot be written: permission denied, a full disk, a directory that cannot
    be created, a rename or flush that fails. Nothing was left under the final name."""


class OutputExistsError(OutputError):
    """The destination is refused before any work: it exists (pass ``overwrite=True``,
    ``--overwrite``, to replace it), it is or lies inside an input, or it is not a place a
    file or database can go."""


class BackendError(Mnist2dbError):
    """LMDB or LevelDB refused an operation, or a path is not a database of either kind
    (a file the system cannot write is an :class:`OutputError`)."""


class DownloadError(Mnist2dbError):
    """No mirror delivered a file."""


class ChecksumError(DownloadError):
    """A downloaded file matches none of the published digests."""


class ImageError(Mnist2dbError):
    """An image file cannot be read or written as Caffe's OpenCV would, or a list of images
    is malformed (the file and the line are named)."""


class DatumError(Mnist2dbError):
    """A stored value is not a Datum, or its data does not match its declared shape."""


class RecordIndexError(Mnist2dbError, IndexError):
    """An index outside ``range(len(db))``; also an IndexError, as sequences raise."""


class MissingKeyError(Mnist2dbError, KeyError):
    """No record is stored under a key; also a KeyError, as mappings raise."""

    def __str__(self) -> str:
        # KeyError quotes its argument; the message is a sentence, keep it as written.
        return printable(str(self.args[0])).replace("\n", "\\x0a") if self.args else ""


class VerifyError(Mnist2dbError):
    """A database differs from the IDX files it is compared with (key and field named)."""


class RenderError(Mnist2dbError):
    """An image cannot be drawn (a channel count other than 1 or 3), or a PNG not written."""
