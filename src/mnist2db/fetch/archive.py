"""A dataset published as one archive (EMNIST's ``gzip.zip``): download once, extract a split.

The archive is fetched like any file (resumable, retried, verified against its published
digests before it reaches its final name) and **kept** in its home directory (``data/emnist``
beside ``data/emnist-<split>``), so fetching another split reads the kept archive instead of
the network. A kept archive is verified again (hashed) before each use, and never removed by
mnist2db: delete it when no more splits are needed. An archive found in a ``--mirror``
directory is verified and read where it is, not copied.

Only the split's members are read, one at a time, streaming: each goes through the same sink
as a download (gzip unpacked with its bomb guard, written beside the destination, placed
only when complete), vouched for by the archive's digest; the other members stay packed.
"""

from __future__ import annotations

import contextlib
import os
import time
import zipfile
from collections.abc import Callable, Sequence

from mnist2db.errors import DownloadError
from mnist2db.fetch.catalog import Archive, Dataset, Resource
from mnist2db.fetch.fetcher import FetchedFile, fetch_failure, present, record
from mnist2db.fetch.manifest import verified_present, write_manifest
from mnist2db.fetch.sink import (
    CHUNK,
    MAX_UNPACKED,
    DownloadSink,
    SourceFailed,
    file_digests,
    match,
)
from mnist2db.fetch.transport import Options, download, is_url, source_for


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
    path, how = _obtain(archive, archive_path(archive, directory, home), sources, opts, on_file)
    results = []
    try:
        with zipfile.ZipFile(path) as bundle:
            for resource, item in zip(spec.resources, found, strict=True):
                result = item
                if result is None:
                    result, sink = _extract(bundle, path, resource, directory, how)
                    record(manifest, resource, sink)
                    with contextlib.suppress(OSError):
                        write_manifest(directory, spec.name, manifest)
                if on_file is not None:
                    on_file(result)
                results.append(result)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise DownloadError(f"{path}: not a readable zip archive ({exc})") from None
    return results


def _obtain(
    archive: Archive,
    kept: str,
    sources: Sequence[str],
    opts: Options,
    on_file: Callable[[FetchedFile], None] | None,
) -> tuple[str, str]:
    """A verified copy of the archive: (its path, which digest matched)."""
    start = time.perf_counter()
    resource = _as_resource(archive)
    how = verified_present(kept, archive.digests, None, archive.name)
    if how is not None:
        if on_file is not None:
            on_file(FetchedFile(archive.name, kept, "present", None, how, 0, 0.0))
        return kept, how
    directory = os.path.dirname(kept)
    failures: list[tuple[str, SourceFailed]] = []
    for mirror in sources:
        where = source_for(mirror, resource.remote)
        if not is_url(mirror):
            # A directory holding the archive: verified and read in place, not copied.
            try:
                how = _verify_in_place(where, resource)
            except SourceFailed as exc:
                failures.append((where, exc))
                continue
            if on_file is not None:
                on_file(FetchedFile(archive.name, where, "present", None, how, 0, 0.0))
            return where, how
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise DownloadError(
                f"{directory}: cannot create the directory: {exc.strerror}"
            ) from None
        try:
            sink = DownloadSink(kept, resource, packing="zip", keep_packed=False)
        except OSError as exc:
            raise DownloadError(f"{kept}: cannot write in {directory}: {exc.strerror}") from None
        try:
            download(where, sink, opts, archive.name, archive.size or 0)
            how = sink.finish()
            sink.place()
        except SourceFailed as exc:
            failures.append((where, exc))
            continue
        except OSError as exc:  # writing the temporary or placing it (disk full, ...)
            raise DownloadError(f"{kept}: cannot write: {exc.strerror or exc}") from None
        finally:
            sink.discard()
        if on_file is not None:
            seconds = time.perf_counter() - start
            on_file(
                FetchedFile(archive.name, kept, "downloaded", where, how, sink.received, seconds)
            )
        return kept, how
    raise fetch_failure(archive.name, failures)


def _verify_in_place(path: str, resource: Resource) -> str:
    if not os.path.isfile(path):
        raise SourceFailed("not found")
    digests = file_digests(path, ["sha256", *resource.unpacked])
    if digests is None:
        raise SourceFailed("cannot read it")
    return match(resource, {}, digests)


def _extract(
    bundle: zipfile.ZipFile, path: str, resource: Resource, directory: str, how: str
) -> tuple[FetchedFile, DownloadSink]:
    """One member, unpacked and placed under the resource's name; refuses a damaged one."""
    start = time.perf_counter()
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
        except (NotImplementedError, RuntimeError, zipfile.BadZipFile) as exc:
            # An unsupported compression method, an encrypted or damaged member.
            raise DownloadError(f"{resource.name}: cannot read {where} ({exc})") from None
        with member:
            while True:
                try:
                    chunk = member.read(CHUNK)
                except (zipfile.BadZipFile, OSError, EOFError) as exc:
                    raise DownloadError(f"{resource.name}: cannot read {where} ({exc})") from None
                if not chunk:
                    break
                sink.feed(chunk)
        verified = sink.finish(vouched=f"in {os.path.basename(path)}, {how}")
        sink.place()
    except SourceFailed as exc:
        raise DownloadError(f"{resource.name}: {where}: {exc}") from None
    except OSError as exc:
        raise DownloadError(f"{final}: cannot write: {exc.strerror or exc}") from None
    finally:
        sink.discard()
    seconds = time.perf_counter() - start
    return FetchedFile(
        resource.name, final, "extracted", where, verified, sink.received, seconds
    ), sink
