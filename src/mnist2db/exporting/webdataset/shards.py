"""``export --to webdataset``: a database as WebDataset tar shards and their manifest.

``OUT-000000.tar``, ``OUT-000001.tar``, …: at most ``shard_size`` records (and, when given,
``shard_bytes`` bytes: a shard holds at least one record) each, in key order. A record is
the sample ``KEY.EXT`` (its file's bytes, as ``export --to files`` writes them:
:mod:`mnist2db.exporting.samples`) and ``KEY.cls`` (the label, in decimal), plus
``KEY.json`` when there is more to say: the source key, when ``KEY`` is not the key itself
(a loader cuts a member's name at its first dot, so a key that is not plain is mapped,
:func:`~mnist2db.exporting.samples.sample_key`), and the targets of a label database
(``label_db``: every sample then has one, :mod:`mnist2db.exporting.float_labels`). Members are plain USTAR entries (mode 0644,
time 0, owner 0), so a shard's bytes depend on the records alone.

``OUT.shards.json`` lists every shard (name, records, bytes, SHA-256, first and last key)
and whether the export is ``complete``. Each shard is written under a temporary name,
flushed and renamed: it appears complete or not at all; the manifest is replaced (the same
way) after each shard. A killed export is resumed shard by shard (``resume``: the shards the
manifest lists are checked against their SHA-256, and the records after the last one are
exported), or started again with ``overwrite``, which replaces only shards a manifest of
ours lists.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mnist2db.errors import ArgumentError, OutputError
from mnist2db.exporting.float_labels import TargetStream
from mnist2db.exporting.png_worker import PngWorker
from mnist2db.exporting.sample_batches import iter_batches, prefetched, start_png_worker
from mnist2db.exporting.samples import class_names
from mnist2db.exporting.webdataset.resume_checks import check_resume, source_state
from mnist2db.exporting.webdataset.shard_files import (
    MANIFEST_FORMAT,
    check_shard_names,
    check_targets,
    is_regular,
    manifest_name,
    remove_stale_temporaries,
    shard_name,
    write_manifest,
)
from mnist2db.exporting.webdataset.shard_writer import ShardFile, Workers, folder_identity
from mnist2db.exporting.webdataset.tar_members import batch_tars
from mnist2db.interrupt import deferred
from mnist2db.progress import Progress, reporting
from mnist2db.storage.databases.readers import DbReader, shared_reader
from mnist2db.storage.files import check_made, make_parents, remove_made

DEFAULT_SHARD_SIZE = 10000


@dataclass(frozen=True)
class ShardsResult:
    """What :func:`export_webdataset` wrote: the manifest, the shards' paths, ``count``
    records (``resumed`` of them by an earlier run), ``mapped`` sample keys that are not the
    record's key, ``bytes`` of shards, ``classes`` the class names recorded."""

    manifest: str
    shards: tuple[str, ...]
    count: int
    resumed: int
    mapped: int
    bytes: int
    classes: tuple[str, ...]
    #: Values a record in each ``KEY.json`` (0: no ``label_db``).
    targets: int = 0


def export_webdataset(
    db: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    shard_bytes: int | None = None,
    classes: str | os.PathLike[str] | None = None,
    label_db: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: Progress | None = None,
) -> ShardsResult:
    """Write every record of ``db`` to WebDataset shards ``OUT-000000.tar``, … and
    ``OUT.shards.json`` (see the module's docstring). ``label_db``: ``db``'s label database,
    read in the same pass (checked to be its pair, as ``verify --label-db`` checks), its
    targets in each sample's ``KEY.json``.

    Raises:
        ArgumentError: ``shard_size`` or ``shard_bytes`` below 1, both ``overwrite`` and
            ``resume``, an empty ``out``.
        OutputExistsError: shards or a manifest exist (without ``overwrite`` or ``resume``;
            with ``overwrite``: a shard no manifest lists), a shard would land on the
            database, or the export to resume was made otherwise or changed since.
        DatumError: a record is not a Datum, or is raw with other than 1 or 3 channels.
        VerifyError: ``label_db`` is not ``db``'s label database (naming the first key that
            breaks the pair; the counts before any shard).
        OutputError: a shard cannot be written (a full disk: no partial shard is left).
    """
    progress = reporting(progress)
    db_path = os.fsdecode(db)
    out_path = os.fsdecode(out)
    if shard_size < 1 or (shard_bytes is not None and shard_bytes < 1):
        raise ArgumentError("--shard-size and --shard-bytes are at least 1")
    if overwrite and resume:
        raise ArgumentError("--overwrite starts again, --resume goes on: choose one")
    labels_path = os.fsdecode(label_db) if label_db is not None else None
    names, _ = class_names(db_path, classes)
    inputs = [db_path] + ([labels_path] if labels_path is not None else [])
    found = check_targets(out_path, inputs, overwrite, resume)
    options: dict[str, Any] = {
        "source": os.path.abspath(db_path),
        "shard_size": shard_size,
        "shard_bytes": shard_bytes,
    }
    if labels_path is not None:
        options["label_db"] = os.path.abspath(labels_path)
    parent = os.path.dirname(out_path) or os.curdir
    try:
        made = make_parents(parent)
    except OSError as exc:
        raise OutputError(f"{out_path}: cannot create its directory: {exc.strerror}") from None
    try:
        check_made(made)  # the shards go inside them, never through a link
        with contextlib.ExitStack() as stack:
            reader = stack.enter_context(shared_reader(db_path))
            pair = None
            if labels_path is not None:
                label_reader = stack.enter_context(shared_reader(labels_path))
                pair = (TargetStream(db_path, labels_path, reader, label_reader), label_reader)
            state = source_state(reader)
            if resume and found is not None:  # before anything is touched
                replacing = check_resume(out_path, found, options, state, reader)
            else:
                replacing = check_shard_names(out_path, found, resume=False)
            remove_stale_temporaries(out_path)
            options["source_state"] = state
            return _write_shards(reader, db_path, out_path, found if resume else None,
                                 replacing, options, names, progress, pair)  # fmt: skip
    except OSError as exc:
        remove_made(made)
        raise OutputError(
            f"{exc.filename or out_path}: cannot write: {exc.strerror or exc}"
        ) from None
    except BaseException:
        remove_made(made)
        raise


def _write_shards(
    reader: DbReader,
    db_path: str,
    out: str,
    resumed: dict[str, Any] | None,
    replacing: list[str],
    options: dict[str, Any],
    names: tuple[str, ...],
    progress: Progress,
    pair: tuple[TargetStream, DbReader] | None = None,
) -> ShardsResult:
    total = len(reader)
    shards: list[dict[str, Any]] = list(resumed["shards"]) if resumed else []
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": 1,
        **options,
        "records": total,
        "classes": list(names),
        **({"targets": pair[0].names} if pair is not None else {}),
        "complete": False,
        "shards": shards,
        "replacing": replacing,
    }
    manifest_path = manifest_name(out)
    if resumed is None:
        write_manifest(manifest_path, manifest)  # before a shard is replaced
    before = sum(int(entry["records"]) for entry in shards)
    records: Iterator[tuple[bytes, bytes]]
    if shards:
        # The smallest key after the last one exported: the last key and a 0 byte.
        after = bytes.fromhex(shards[-1]["last_key_hex"]) + b"\0"
        records = reader.iter_views(after)
        if pair is not None:
            records = pair[0].records(records, pair[1].iter_from(after), start=before)
    else:
        records = reader.iter_views()
        if pair is not None:
            records = pair[0].records(records, pair[1])
    targets = pair[0] if pair is not None else None
    count, mapped = before, 0
    shard: ShardFile | None = None
    previous = ""
    made = len(shards)  # shards made so far (those listed, and those being committed)
    shard_size, shard_bytes = options["shard_size"], options["shard_bytes"]

    committed: list[dict[str, Any]] = []  # placed by the committing thread, not listed yet

    def placed(entry: dict[str, Any]) -> None:  # on the committing thread, shard by shard
        committed.append(entry)

    def list_placed() -> None:
        # Here, not on the committing thread (a manifest's AtomicFile defers signals, which is
        # the main thread's business), before the next shard is committed: at most one
        # shard is ever placed and not listed (what check_shard_names proves ours).
        workers.wait_commits()
        if committed:
            shards.extend(committed)
            committed.clear()
            write_manifest(manifest_path, manifest)

    # The values are views into the database's map (iter_views): every shard's bytes are
    # written and hashed before the reader is closed (workers.close(), below).
    first = reader.first_key()
    worker: PngWorker | None = None
    workers = Workers()  # its threads start with its first task
    replaceable = set(replacing)
    parent = os.path.dirname(out)
    folder = folder_identity(parent or os.curdir)  # each shard goes into this folder, not a link's
    try:
        # Forked here, before this export's threads: a process to encode raw records' PNGs;
        # a signal meanwhile is raised once it is made (os.fork runs handlers of its own,
        # which would swallow the exception), and it is closed below.
        with deferred():
            worker = start_png_worker(reader.get(first) if first is not None else None)
        abort = worker.kill if worker is not None else None
        for batch in prefetched(iter_batches(db_path, records, worker), abort=abort):
            framed = batch_tars(batch, previous, count, targets)
            previous, offsets = framed.last, framed.offsets
            i, n = 0, len(batch.keys)
            while i < n:
                if shard is not None and (
                    shard.count >= shard_size
                    or (shard_bytes and shard.size + offsets[i + 1] - offsets[i] > shard_bytes)
                ):
                    list_placed()
                    shard.finish(placed)
                    shard = None
                    progress(count, total)
                if shard is None:
                    path = shard_name(out, made)
                    if folder_identity(parent or os.curdir) != folder:
                        raise OSError(errno.ELOOP, "no longer the folder it was (a link?)",
                                      parent or os.curdir)  # fmt: skip
                    # Over a shard of ours only: any other file there is refused, not replaced.
                    shard = ShardFile(path, workers, os.path.basename(path) in replaceable, folder)
                    made += 1
                # The samples from i that fit (the first one does: the shard is empty, or
                # was checked above).
                j = min(n, i + shard_size - shard.count)
                if shard_bytes:
                    fit = bisect.bisect_right(offsets, offsets[i] + shard_bytes - shard.size) - 1
                    j = max(i + 1, min(j, fit))
                shard.add(batch.keys[i], batch.keys[j - 1], j - i, offsets[j] - offsets[i],
                          framed.pieces(i, j))  # fmt: skip
                count += j - i
                mapped += sum(framed.mapped[i:j])
                i = j
        if shard is not None:
            list_placed()
            shard.finish(placed)
            shard = None
        workers.drain()
        shards.extend(committed)  # listed by the manifest written below
    except BaseException:
        if worker is not None:
            worker.close(abort=True)  # at once: a stopped worker never answers
            worker = None
        raise
    finally:
        workers.close()  # and the temporary of a shard not committed
        if worker is not None:
            worker.close()
    written = {entry["name"] for entry in shards}
    for name in replacing:  # an earlier export's shards beyond this one's (names checked)
        path = os.path.join(parent, name)
        if name not in written and is_regular(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    manifest["complete"] = True
    manifest["replacing"] = []
    manifest["records"] = count
    write_manifest(manifest_path, manifest)
    progress(count, total)
    return ShardsResult(
        manifest_path,
        tuple(os.path.join(parent, entry["name"]) for entry in shards),
        count,
        before,
        mapped,
        sum(int(entry["bytes"]) for entry in shards),
        names,
        targets.width if targets is not None else 0,
    )
