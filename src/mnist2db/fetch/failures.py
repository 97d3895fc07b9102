"""Why one source of a file failed: the signals between the transport, the sink and the
fetcher (never raised out of :mod:`mnist2db.fetch`: the fetcher turns them into one
:class:`~mnist2db.errors.DownloadError` that lists every mirror with its reason)."""

from __future__ import annotations


class SourceFailed(Exception):
    """This source cannot deliver the file; the reason goes into the final error line."""


class Transient(SourceFailed):
    """Worth retrying on the same source (connection cut, timeout, 5xx)."""


class Rejected(SourceFailed):
    """Delivered, but the bytes are not the file (no digest matches, damaged packing)."""
