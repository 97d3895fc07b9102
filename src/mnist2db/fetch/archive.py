"""A dataset published as one archive (EMNIST's ``gzip.zip``): download once, extract a split.

The archive is fetched like any file (resumable, retried, verified against its published
digests before it reaches its final name) and **kept** in its home directory (``data/emnist``
beside ``data/emnist-<split>``), so fetching another split reads the kept archive instead of
the network. A kept archive is verified again (hashed) before each use, and never removed by
mnist2db: delete it when no more splits are needed. An archive found in a ``--mirror``
directory is verified and read where it is, not copied.

What is extracted is what was hashed: the archive is hashed and read through one open file
(a download's through the temporary's own descriptor, kept across the rename), so a file
renamed over it meanwhile is never read; one written into in place is noticed (its size or
change time moves) and refused before any member it fed is placed.

Only the split's members are read, one at a time, streaming: each goes through the same sink
as a download (gzip unpacked with its bounds, written beside the destination, placed only
when complete), vouched for by the archive's digest; the other members stay packed.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from typing import IO

from mnist2db.errors import DownloadError
from mnist2db.fetch.catalog import Archive, Dataset, Resource
from mnist2db.fetch.failures import Rejected, SourceFailed
from mnist2db.fetch.manifest import verify_handle, write_manifest
from mnist2db.fetch.results import FetchedFile, create_directory, fetch_failure, present, record
from mnist2db.fetch.sink import CHUNK, MAX_UNPACKED, DownloadSink
from mnist2db.fetch.transport import Options, download, is_url, source_for
from mnist2db.storage.files import remove_made, remove_stale, temp_prefix
from mnist2db.untrusted import NotRegularFile, clean, open_regular

#: What reading a damaged member raises (zipfile lets the decompressors' errors through).
_MEMBER_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)


def archive_path(archive: Archive, data_dir: str, home: str | None = None) -> str:
    """Where ``archive`` is kept: ``home``, default its home beside ``data_dir``."""
    if home is None:
        data = os.path.normpath(data_dir)
        if os.path.basename(data) in (".", ".."):
            data = os.path.abspath(data)
        home = os.path.join(os.path.dirname(data), archive.home)
    return os.path.join(home, archive.name)


def _as_resource(archive: Archive) -> Resource:
    return Resource(
        archive.name, unpacked=archive.digests, size=archive.size, packing="zip", idx=False
    )


class _Verified:
    """An open, verified archive: read only through ``handle``; ``unchanged`` tells whether
    the file was written to since it was hashed."""

    def __init__(self, handle: IO[bytes], path: str, how: str) -> None:
        self.handle = handle
        self.path = path
        self.how = how
        self.stamp = _stamp(handle)

    def check_unchanged(self) -> None:
        if _stamp(self.handle) != self.stamp:
            raise DownloadError(
                f"{self.path}: changed while it was being read (after it was verified); "
                "nothing more extracted from it"
            )


def _stamp(handle: IO[bytes]) -> tuple[int, int, int]:
    info = os.fstat(handle.fileno())
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def fetch_from_archive(
    spec: Dataset,
    directory: str,
    home: str | None,
    sources: Sequence[str],
    opts: Options,
    manifest: dict[str, str],
    *,
    force: bool,
    on_file: Callable[[FetchedFile], None] | None,
) -> list[FetchedFile]:
    """:func:`mnist2db.fetch.fetcher.fetch` for a dataset whose files are members of one archive."""
    archive = spec.archive
    if archive is None:  # the caller checks; this keeps the type checker informed
        raise DownloadError(f"{spec.name}: not published as an archive")
    found = [None if force else present(r, directory, manifest) for r in spec.resources]
    if all(found):
        done = [ready for ready in found if ready is not None]
        for ready in done:
            if on_file is not None:
                on_file(ready)
        return done
    verified, got = _obtain(archive, archive_path(archive, directory, home), sources, opts)
    path = verified.path
    results = []
    with verified.handle:
        if on_file is not None:
            on_file(got)
        try:
            bundle = zipfile.ZipFile(verified.handle)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
            raise DownloadError(f"{path}: not a readable zip archive ({clean(exc)})") from None
        with bundle:
            for resource, item in zip(spec.resources, found, strict=True):
                result = item
                if result is None:
                    result, sink = _extract(bundle, verified, resource, directory)
                    record(manifest, resource, sink)
                    with contextlib.suppress(OSError):
                        write_manifest(directory, spec.name, manifest)
                if on_file is not None:
                    on_file(result)
                results.append(result)
    return results


def _obtain(
    archive: Archive,
    kept: str,
    sources: Sequence[str],
    opts: Options,
) -> tuple[_Verified, FetchedFile]:
    """A verified copy of the archive, open, and what was done to get it (told by the
    caller once the handle is in its ``with``: nothing can leave it open)."""
    start = time.perf_counter()
    resource = _as_resource(archive)
    home = os.path.dirname(kept) or "."
    # Checked before any download: the verified archive could not be kept there.
    if os.path.isdir(kept):
        raise DownloadError(f"{kept}: is a directory, where the verified archive is to be kept")
    # Temporaries of killed downloads (up to the archive's size each) are removed, also when
    # this run takes the archive from elsewhere.
    remove_stale(home, temp_prefix(archive.name), directories=False)
    failures: list[tuple[str, SourceFailed]] = []
    verified = _open_verified(kept, resource, failures, not_ours_fatal=True)
    if verified is not None:
        return verified, FetchedFile(archive.name, kept, "present", None, verified.how, 0, 0.0)
    for mirror in sources:
        where = source_for(mirror, resource.remote)
        if not is_url(mirror):
            # A directory holding the archive: verified and read in place, not copied.
            verified = _open_verified(where, resource, failures)
            if verified is None:
                continue
            return verified, FetchedFile(archive.name, where, "present", None, verified.how, 0, 0.0)
        made = create_directory(home)
        try:
            verified = _download(where, kept, resource, opts, archive)
        except SourceFailed as exc:
            remove_made(made)
            failures.append((where, exc))
            continue
        except BaseException:
            remove_made(made)
            raise
        seconds = time.perf_counter() - start
        size = os.fstat(verified.handle.fileno()).st_size
        return verified, FetchedFile(
            archive.name, kept, "downloaded", where, verified.how, size, seconds
        )
    raise fetch_failure(archive.name, failures)


def _download(
    where: str, kept: str, resource: Resource, opts: Options, archive: Archive
) -> _Verified:
    """The archive downloaded from ``where``, verified, placed at ``kept`` and open."""
    try:
        sink = DownloadSink(kept, resource, packing="zip", keep_packed=False)
    except OSError as exc:
        raise DownloadError(
            f"{kept}: cannot write in {os.path.dirname(kept)}: {exc.strerror}"
        ) from None
    try:
        download(where, sink, opts, archive.name, archive.size or 0)
        how = sink.finish()
        handle = sink.place(keep_open=True)
    except OSError as exc:  # writing the temporary or placing it (disk full, ...)
        raise DownloadError(f"{kept}: cannot write: {exc.strerror or exc}") from None
    finally:
        sink.discard()
    if handle is None:  # pragma: no cover - place(keep_open=True) always returns one
        raise DownloadError(f"{kept}: not kept open")
    return _Verified(handle, kept, how)


def _open_verified(
    path: str,
    resource: Resource,
    failures: list[tuple[str, SourceFailed]],
    not_ours_fatal: bool = False,
) -> _Verified | None:
    """``path`` opened, its size checked, hashed, and rewound; None (the reason added to
    ``failures`` when it exists) when it is missing or does not verify."""
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        if not not_ours_fatal:
            failures.append((path, SourceFailed("not found")))
        return None
    except NotRegularFile as exc:
        if not_ours_fatal:
            # Not a file mnist2db kept: not replaced by a download.
            raise DownloadError(f"{path}: {exc.strerror}; not an archive mnist2db kept") from None
        failures.append((path, SourceFailed(f"cannot read: {exc.strerror}")))
        return None
    except OSError as exc:
        failures.append((path, SourceFailed(f"cannot read: {exc.strerror}")))
        return None
    try:
        size = os.fstat(handle.fileno()).st_size
        if resource.size and size != resource.size:
            # Checked before hashing: a sparse file of any size is refused at once.
            raise Rejected(f"{size} bytes, {resource.name} is published as {resource.size} bytes")
        if size > MAX_UNPACKED:
            raise Rejected(f"{size} bytes, more than an archive of this dataset can be")
        how = verify_handle(handle, path, resource.unpacked, None, resource.name)
        if how is None:
            raise Rejected(f"does not match the published digests of {resource.name}")
        handle.seek(0)
        return _Verified(handle, path, how)
    except SourceFailed as exc:
        handle.close()
        failures.append((path, exc))
        return None
    except OSError as exc:
        handle.close()
        failures.append((path, SourceFailed(f"cannot read: {exc.strerror}")))
        return None
    except BaseException:
        handle.close()
        raise


def _extract(
    bundle: zipfile.ZipFile, verified: _Verified, resource: Resource, directory: str
) -> tuple[FetchedFile, DownloadSink]:
    """One member, unpacked and placed under the resource's name; refuses a damaged one."""
    start = time.perf_counter()
    path = verified.path
    final = os.path.join(directory, resource.name)
    where = f"{path}:{resource.remote}"
    try:
        info = bundle.getinfo(resource.remote)
    except KeyError:
        raise DownloadError(f"{resource.name}: {path} has no member {resource.remote}") from None
    if info.file_size > MAX_UNPACKED:
        raise DownloadError(
            f"{resource.name}: {where} holds {info.file_size} bytes; not an IDX file"
        )
    try:
        sink = DownloadSink(final, resource, packing=resource.packing, keep_packed=False)
    except OSError as exc:
        raise DownloadError(f"{final}: cannot write in {directory}: {exc.strerror}") from None
    try:
        try:
            member = bundle.open(info)
        except _MEMBER_ERRORS as exc:
            # An unsupported compression method, an encrypted or damaged member.
            raise DownloadError(f"{resource.name}: cannot read {where} ({clean(exc)})") from None
        with member:
            while True:
                try:
                    chunk = member.read(CHUNK)
                except _MEMBER_ERRORS as exc:
                    raise DownloadError(
                        f"{resource.name}: cannot read {where}: damaged member ({clean(exc)})"
                    ) from None
                if not chunk:
                    break
                sink.feed(chunk)
        verified_by = sink.finish(vouched=f"in {os.path.basename(path)}, {verified.how}")
        verified.check_unchanged()  # what was read is what was hashed
        sink.place()
    except SourceFailed as exc:
        raise DownloadError(f"{resource.name}: {where}: {exc}") from None
    except OSError as exc:
        raise DownloadError(f"{final}: cannot write: {exc.strerror or exc}") from None
    finally:
        sink.discard()
    seconds = time.perf_counter() - start
    return FetchedFile(
        resource.name, final, "extracted", where, verified_by, sink.received, seconds
    ), sink
