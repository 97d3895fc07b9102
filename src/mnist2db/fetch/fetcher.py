"""Fetch a dataset's files from its mirrors, verified and unpacked: the orchestration.

For each file of a dataset (:mod:`mnist2db.fetch.catalog`): leave it alone when present and
verified; else unpack a packed copy kept beside it; else take it from the first source that
delivers it verified — ``--mirror`` sources first, then the table's. Bytes stream from the
transport (:mod:`mnist2db.fetch.transport`) into a sink (:mod:`mnist2db.fetch.sink`) that hashes, unpacks
and writes them beside the destination; a file reaches its final name only once verified,
so an interrupted or failed fetch never leaves an unverified file under a final name. What
was placed is recorded in the manifest (:mod:`mnist2db.fetch.manifest`). A dataset published as
one archive (EMNIST's ``gzip.zip``) goes through :mod:`mnist2db.fetch.archive`.

A source's fault (not found, refused, cut, damaged, checksum mismatch) moves on to the next
source; a local write failure (disk full, file size limit) stops at once: ``cannot write``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence

from mnist2db import interrupt
from mnist2db.errors import DownloadError
from mnist2db.fetch.archive import fetch_from_archive
from mnist2db.fetch.catalog import (
    DEFAULT_DATASET,
    PACKING_SUFFIX,
    Dataset,
    Resource,
    default_data_dir,
    get_dataset,
)
from mnist2db.fetch.failures import SourceFailed
from mnist2db.fetch.manifest import (
    read_manifest,
    write_manifest,
)
from mnist2db.fetch.results import FetchedFile, create_directory, fetch_failure, present, record
from mnist2db.fetch.sink import DownloadSink
from mnist2db.fetch.transport import (
    DEFAULT_SPEED_LIMIT,
    DEFAULT_SPEED_TIME,
    FetchProgress,
    Options,
    check_mirror,
    download,
    is_url,
    local_dir,
    read_local,
    source_for,
)
from mnist2db.progress import named_reporting
from mnist2db.storage.files import remove_made

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF = 1.0


def fetch(
    dataset: str | Dataset = DEFAULT_DATASET,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    mirrors: Sequence[str] = (),
    force: bool = False,
    keep_gz: bool = False,
    archive_dir: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
    backoff: float | None = None,
    speed_limit: float = DEFAULT_SPEED_LIMIT,
    speed_time: float = DEFAULT_SPEED_TIME,
    progress: FetchProgress | None = None,
    on_file: Callable[[FetchedFile], None] | None = None,
) -> list[FetchedFile]:
    """Fetch a dataset's files into ``data_dir``, verified and unpacked.

    Files already present and verified (against a published unpacked digest, or the sha256
    recorded when this function placed them) are left alone unless ``force``. A ``.gz``
    kept beside a missing or corrupt file is unpacked instead of downloading. Each file is
    otherwise taken from the first source that delivers it verified: ``mirrors`` first, then
    the dataset's own.

    Args:
        dataset: a name in :data:`DATASETS`, or a :class:`Dataset` (tests pass their own).
        data_dir: destination directory; default ``data/<dataset>``. Created if missing.
        mirrors: extra mirrors tried first, in order: ``http(s)://`` or ``file://`` URLs,
            or plain directories (which may also hold unpacked files).
        force: download even when a verified file is present.
        keep_gz: also keep the verified ``.gz`` (``.xz``) file beside each file.
        archive_dir: for a dataset published as one archive (EMNIST's ``gzip.zip``), where
            the verified archive is kept; default ``emnist`` beside ``data_dir``
            (``data/emnist``), so every split shares it.
        timeout: seconds to wait for a connection or for data before counting a failure.
        retries: retries of a transient failure (cut, timeout, 5xx) per mirror; a restart
            from zero (a server ignoring ``Range``) is one.
        backoff: seconds before the first retry, doubled for each further one; default
            :data:`DEFAULT_BACKOFF`.
        speed_limit, speed_time: the low-speed limit, as curl's ``--speed-limit`` and
            ``--speed-time``: a mirror slower than ``speed_limit`` bytes/s for
            ``speed_time`` seconds is abandoned for the next one (0: no limit).
        progress: called as ``progress(name, bytes_done, bytes_total)`` while downloading.
        on_file: called with each :class:`FetchedFile` as soon as that file is done (for
            an archive dataset, first with the archive: present, or downloaded).

    Returns:
        One :class:`FetchedFile` per file, in the dataset's order.

    Raises:
        ChecksumError: every source delivered bytes matching no published digest.
        DownloadError: no source delivered a verified file (the line lists each with its
            reason), or the destination cannot be written. The directories this call
            created are removed again when they are left empty.
    """
    spec = get_dataset(dataset)
    directory = os.fspath(data_dir) if data_dir is not None else default_data_dir(spec)
    sources = [*mirrors, *spec.mirrors]
    for mirror in sources:
        check_mirror(mirror)
    if backoff is None:
        backoff = DEFAULT_BACKOFF
    opts = Options(
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        progress=named_reporting(progress),
        speed_limit=speed_limit,
        speed_time=speed_time,
    )
    made = create_directory(directory)
    try:
        manifest = read_manifest(directory, spec.name)
        if spec.archive is not None:
            home = os.fspath(archive_dir) if archive_dir is not None else None
            return fetch_from_archive(
                spec, directory, home, sources, opts, manifest, force=force, on_file=on_file
            )
        results = []
        for resource in spec.resources:
            result = _fetch_one(
                resource, directory, spec.name, sources, opts, manifest, force, keep_gz
            )
            if on_file is not None:
                on_file(result)
            results.append(result)
        return results
    except BaseException:
        remove_made(made)  # only those left empty: what was verified and placed stays
        raise


def _fetch_one(
    resource: Resource,
    directory: str,
    dataset: str,
    sources: Sequence[str],
    opts: Options,
    manifest: dict[str, str],
    force: bool,
    keep_gz: bool,
) -> FetchedFile:
    start = time.perf_counter()
    final = os.path.join(directory, resource.name)
    suffix = PACKING_SUFFIX[resource.packing]
    keep_gz = keep_gz and bool(suffix)
    packed_final = final + suffix
    if not force:
        found = present(resource, directory, manifest, keep_gz)
        if found is not None:
            return found
    # (where, is a URL, packing); a packed file kept beside the file comes first.
    candidates: list[tuple[str, bool, str]] = []
    if not force and suffix and os.path.isfile(packed_final):
        candidates.append((packed_final, False, resource.packing))
    for mirror in sources:
        if is_url(mirror):
            candidates.append((source_for(mirror, resource.remote), True, resource.packing))
        else:
            packed_path = source_for(mirror, resource.remote)
            raw_path = os.path.join(local_dir(mirror), resource.name)
            if suffix and not os.path.exists(packed_path) and os.path.isfile(raw_path):
                candidates.append((raw_path, False, "none"))
            else:
                candidates.append((packed_path, False, resource.packing))
    failures: list[tuple[str, SourceFailed]] = []
    for where, url, packing in candidates:
        beside = where == packed_final
        sink: DownloadSink | None = None
        try:
            # Deferred: a signal between creating the temporaries and this try would leave
            # them behind (its finally removes them).
            with interrupt.deferred():
                try:
                    sink = DownloadSink(
                        final, resource, packing=packing, keep_packed=keep_gz and not beside
                    )
                except OSError as exc:
                    raise DownloadError(
                        f"{final}: cannot write in {directory}: {exc.strerror}"
                    ) from None
            if url:
                download(where, sink, opts, resource.name, resource.size or 0)
            else:
                read_local(where, sink, opts, resource.name)
            how = sink.finish()
            sink.place()
            record(manifest, resource, sink)
            with contextlib.suppress(OSError):
                write_manifest(directory, dataset, manifest)
            return FetchedFile(
                resource.name,
                final,
                "unpacked" if beside else "downloaded",
                where,
                how,
                sink.received,
                time.perf_counter() - start,
            )
        except SourceFailed as exc:
            failures.append((where, exc))
        except OSError as exc:  # writing the temporary or placing it (disk full, ...)
            raise DownloadError(f"{final}: cannot write: {exc.strerror or exc}") from None
        finally:
            if sink is not None:
                sink.discard()
    raise fetch_failure(resource.name, failures)
