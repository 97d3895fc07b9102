"""What a fetch did for each file, and the steps both ways of fetching share: a file found
present and verified, its digests recorded, a directory made, every source's failure told
in one line. Used by :mod:`mnist2db.fetch.fetcher` (file by file) and
:mod:`mnist2db.fetch.archive` (members of one archive).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from mnist2db.errors import ChecksumError, DownloadError
from mnist2db.fetch.catalog import PACKING_SUFFIX, Resource
from mnist2db.fetch.failures import Rejected, SourceFailed
from mnist2db.fetch.manifest import verified_present
from mnist2db.fetch.sink import MAX_TEXT, MAX_UNPACKED, DownloadSink, packed_bound
from mnist2db.storage.files import make_parents
from mnist2db.untrusted import clean, shown_url


@dataclass(frozen=True)
class FetchedFile:
    """What :func:`fetch` did for one file.

    Attributes:
        name: the file name (``train-images-idx3-ubyte``).
        path: where the unpacked file is.
        status: ``"present"`` (already there and verified: nothing fetched),
            ``"downloaded"`` (from a mirror), ``"unpacked"`` (from a ``.gz`` kept beside it)
            or ``"extracted"`` (from the dataset's archive, already verified).
        source: the URL or path it came from (``None`` when present).
        verified_by: which published digest matched, e.g. ``".gz sha256"`` or ``"unpacked md5"``.
        nbytes: bytes read from the source (the ``.gz`` size for a download).
        seconds: time taken.
    """

    name: str
    path: str
    status: str
    source: str | None
    verified_by: str
    nbytes: int
    seconds: float


def create_directory(directory: str) -> list[str]:
    """Create ``directory`` and its missing parents; returns those created (for
    :func:`~mnist2db.storage.files.remove_made`). Raises DownloadError naming it."""
    try:
        return make_parents(directory)
    except OSError as exc:
        raise DownloadError(f"{directory}: cannot create the directory: {exc.strerror}") from None


def present(
    resource: Resource, directory: str, manifest: dict[str, str], keep_packed: bool = False
) -> FetchedFile | None:
    """The file as a ``"present"`` :class:`FetchedFile` when it is there and verified."""
    start = time.perf_counter()
    final = os.path.join(directory, resource.name)
    how = verified_present(
        final,
        resource.unpacked,
        manifest.get(resource.name),
        idx=resource.idx,
        limit=MAX_UNPACKED if resource.idx else MAX_TEXT,
    )
    if how is None:
        return None
    if keep_packed:
        packed = final + PACKING_SUFFIX[resource.packing]
        kind = PACKING_SUFFIX[resource.packing]
        recorded = manifest.get(os.path.basename(packed))
        exact = resource.size if resource.size and not resource.unpacked else None
        if not verified_present(
            packed, resource.gz, recorded, kind, size=exact, limit=packed_bound(MAX_UNPACKED)
        ):
            return None
    return FetchedFile(resource.name, final, "present", None, how, 0, time.perf_counter() - start)


def record(manifest: dict[str, str], resource: Resource, sink: DownloadSink) -> None:
    """Note the sha256 of what ``sink`` placed in ``manifest``."""
    manifest[resource.name] = sink.raw_sha256
    if sink.packed is not None and sink.packed_sha256 is not None:
        manifest[resource.name + PACKING_SUFFIX[resource.packing]] = sink.packed_sha256


def fetch_failure(name: str, failures: list[tuple[str, SourceFailed]]) -> DownloadError:
    """One line listing every source with its reason; a ChecksumError if all were rejected."""
    if not failures:
        return DownloadError(f"{name}: no mirror to fetch it from")
    # Reasons quote what servers said: cleaned of control characters (and credentials).
    reasons = "; ".join(f"{shown_url(where)} ({clean(exc, 4000)})" for where, exc in failures)
    if all(isinstance(exc, Rejected) for _, exc in failures):
        return ChecksumError(f"{name}: rejected from every source: {reasons}")
    return DownloadError(f"{name}: no mirror delivered a verified file: {reasons}")
