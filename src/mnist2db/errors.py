"""The library's exceptions: one root, a few subclasses, each message one line naming the file."""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ChecksumError",
    "DownloadError",
    "IdxFormatError",
    "Mnist2dbError",
    "OutputExistsError",
]


class Mnist2dbError(Exception):
    """Root of every error mnist2db raises on purpose; its message is one line for the user."""


class IdxFormatError(Mnist2dbError):
    """An IDX file is missing, unreadable, or not what its header promises."""


class OutputExistsError(Mnist2dbError):
    """The destination exists; pass ``overwrite=True`` (``--overwrite``) to replace it."""


class BackendError(Mnist2dbError):
    """LMDB or LevelDB refused an operation, or a path is not a database of either kind."""


class DownloadError(Mnist2dbError):
    """No mirror delivered a file."""


class ChecksumError(DownloadError):
    """A downloaded file matches none of the published digests."""
