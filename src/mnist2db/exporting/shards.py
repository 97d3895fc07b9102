"""``export --to webdataset``: a database as WebDataset tar shards and their manifest.

``OUT-000000.tar``, ``OUT-000001.tar``, …: at most ``shard_size`` records (and, when given,
``shard_bytes`` bytes: a shard holds at least one record) each, in key order. A record is
the sample ``KEY.EXT`` (its file's bytes, as ``export --to files`` writes them:
:mod:`mnist2db.exporting.samples`) and ``KEY.cls`` (the label, in decimal), plus
``KEY.json`` when there is more to say: the source key, when ``KEY`` is not the key itself
(a loader cuts a member's name at its first dot, so a key that is not plain is mapped,
:func:`~mnist2db.exporting.samples.sample_key`), and the targets of a label database
(``label_db``: every sample then has one, :mod:`mnist2db.exporting.targets`). Members are plain USTAR entries (mode 0644,
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

import contextlib
import hashlib
import json
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnist2db.errors import ArgumentError, OutputError, OutputExistsError
from mnist2db.exporting.samples import Sample, class_names, iter_samples, key_fields, sample_key
from mnist2db.exporting.targets import TargetStream, column_names, sample_json
from mnist2db.progress import Progress, reporting
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import (
    TEMP_MARK,
    AtomicFile,
    make_parents,
    remove_made,
    remove_stale,
    temp_prefix,
)
from mnist2db.storage.readers import DbReader, shared_reader

MANIFEST_FORMAT = "mnist2db webdataset shards"
DEFAULT_SHARD_SIZE = 10000
_MANIFEST_LIMIT = 64 << 20
_BLOCK = 512
_HASH_CHUNK = 1 << 20
#: Bytes of small members gathered before a write.
_WRITE_SIZE = 1 << 20


def shard_name(out: str, index: int) -> str:
    """The path of shard ``index``: ``OUT-000000.tar``."""
    return f"{out}-{index:06d}.tar"


def manifest_name(out: str) -> str:
    """The path of the manifest: ``OUT.shards.json``."""
    return f"{out}.shards.json"


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


def _ustar_template() -> tuple[bytes, int]:
    """A USTAR header of an empty name and size 0 (mode 0644, owner 0, time 0, a regular
    file), its checksum field blank, and the sum of its bytes (the checksum's base)."""
    info = tarfile.TarInfo("")
    info.mode, info.mtime = 0o644, 0
    header = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"\0" * 12  # size: filled per member
    header[148:156] = b" " * 8  # the checksum counts its own field as spaces
    return bytes(header), sum(header)


_TEMPLATE, _TEMPLATE_SUM = _ustar_template()


def _member(name: str, data: bytes) -> list[bytes]:
    """One USTAR member (header, data, padding), as tarfile writes it, several times faster."""
    encoded = name.encode("utf-8")
    if len(encoded) > 100:
        raise OutputError(f"{name}: a member name over 100 bytes (a USTAR limit)")
    size = b"%011o\0" % len(data)
    checksum = _TEMPLATE_SUM + sum(encoded) + sum(size)
    header = b"".join((encoded, _TEMPLATE[len(encoded) : 124], size, _TEMPLATE[136:148],
                       b"%06o\0 " % checksum, _TEMPLATE[156:]))  # fmt: skip
    return [header, data, b"\0" * (-len(data) % _BLOCK)]


def sample_members(
    sample: Sample, name: str, mapped: bool, targets: np.ndarray | None = None
) -> list[bytes]:
    """The tar members of one sample, as pieces to write: ``NAME.EXT``, ``NAME.cls``, and
    ``NAME.json`` when the name is not the key or there are ``targets`` (the source key, the
    label, the targets: :func:`~mnist2db.exporting.targets.sample_json`)."""
    parts = _member(f"{name}.{sample.ext}", sample.data)
    parts += _member(f"{name}.cls", b"%d" % sample.label)
    if mapped or targets is not None:
        text = sample_json(key_fields(sample.key), sample.label, targets)
        parts += _member(f"{name}.json", text)
    return parts


class _Shard:
    """One shard being written: an :class:`AtomicFile`, its hash, its count and keys; small
    members gathered up to :data:`_WRITE_SIZE` bytes, written and hashed together."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = AtomicFile(path).create()
        self.digest = hashlib.sha256()
        self.count = 0
        self.size = 0
        self.first: bytes | None = None
        self.last = b""
        self.pending: list[bytes] = []
        self.pending_size = 0

    def add(self, key: bytes, members: list[bytes], size: int) -> None:
        self.pending += members
        self.pending_size += size
        self.size += size
        self.count += 1
        if self.first is None:
            self.first = key
        self.last = key
        if self.pending_size >= _WRITE_SIZE:
            self._flush()

    def _flush(self) -> None:
        data = b"".join(self.pending)
        self.file.write(data)
        self.digest.update(data)
        self.pending, self.pending_size = [], 0

    def finish(self) -> dict[str, Any]:
        end = b"\0" * (2 * _BLOCK)  # the end-of-archive marker
        self.pending.append(end)
        self.size += len(end)
        self._flush()
        self.file.commit()
        return {
            "name": os.path.basename(self.path),
            "records": self.count,
            "bytes": self.size,
            "sha256": self.digest.hexdigest(),
            "first_key_hex": (self.first or b"").hex(),
            "last_key_hex": self.last.hex(),
        }


def _read_manifest(path: str) -> dict[str, Any] | None:
    """The manifest at ``path`` when it is one of ours; None when there is none."""
    if not os.path.lexists(path):
        return None
    try:
        with open(path, "rb") as stream:
            found = json.loads(stream.read(_MANIFEST_LIMIT))
    except (OSError, ValueError) as exc:
        raise OutputExistsError(f"{path}: exists and is not a shard manifest ({exc})") from None
    if not isinstance(found, dict) or found.get("format") != MANIFEST_FORMAT:
        raise OutputExistsError(f"{path}: exists and is not a shard manifest of mnist2db")
    return found


def _listed(out: str, manifest: dict[str, Any] | None) -> set[str]:
    """The shards ``manifest`` proves ours: those it lists, those it was replacing, and,
    when incomplete, the one after its last (a shard is placed before the manifest that
    lists it)."""
    if manifest is None:
        return set()
    shards = manifest.get("shards", [])
    names = [entry.get("name") for entry in shards] + list(manifest.get("replacing", []))
    if not manifest.get("complete"):
        names.append(os.path.basename(shard_name(out, len(shards))))
    return {n for n in names if isinstance(n, str)}


_SHARD_NAME = re.compile(r"-[0-9]{6}\.tar")


def _existing_shards(out: str) -> list[str]:
    """The names ``OUT-NNNNNN.tar`` present beside ``out``."""
    parent = os.path.dirname(out) or os.curdir
    stem = os.path.basename(out)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(stem) and _SHARD_NAME.fullmatch(n[len(stem) :]))


def _remove_stale_temporaries(out: str) -> None:
    """Temporaries of shards (and of the manifest) left by killed exports to ``out``: every
    ``.OUT-NNNNNN.tar.mnist2db-tmp-<pid>-…`` whose process is gone (a restart with fewer
    shards would not meet them again)."""
    parent = os.path.dirname(out) or os.curdir
    stem = os.path.basename(out)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        target = name[1:].split(TEMP_MARK, 1)[0]
        if (
            name.startswith(f".{stem}")
            and TEMP_MARK in name
            and (_SHARD_NAME.fullmatch(target[len(stem) :]) or target == f"{stem}.shards.json")
        ):
            remove_stale(parent, temp_prefix(target), directories=False)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_resumable(out: str, manifest: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to resume from a manifest of other options, or whose shards changed."""
    for name in [*options, *(["label_db"] if "label_db" not in options else [])]:
        value = options.get(name)
        if manifest.get(name) != value:
            raise OutputExistsError(
                f"{manifest_name(out)}: written with {name} {manifest.get(name)!r}, not "
                f"{value!r}; cannot resume it (use --overwrite to start again)"
            )
    parent = os.path.dirname(out)
    for entry in manifest["shards"]:
        path = os.path.join(parent, entry["name"])
        try:
            found = _file_sha256(path)
        except OSError as exc:
            raise OutputExistsError(
                f"{path}: cannot resume: {exc.strerror} (use --overwrite to start again)"
            ) from None
        if found != entry["sha256"]:
            raise OutputExistsError(
                f"{path}: changed since it was written (SHA-256 {found[:16]}…, the manifest "
                f"has {entry['sha256'][:16]}…); cannot resume (use --overwrite to start again)"
            )


def _check_targets(
    out: str, inputs: list[str], overwrite: bool, resume: bool
) -> dict[str, Any] | None:
    """Every check before any work; returns the manifest found (None: no earlier export)."""
    if not out:
        raise ArgumentError("the output prefix is empty: name the shards' path prefix")
    if out.endswith(os.sep):
        raise ArgumentError(f"{out}: a path prefix of the shards (OUT-000000.tar), not a directory")
    manifest_path = manifest_name(out)
    for target in (manifest_path, shard_name(out, 0)):
        check_file_target(target, True, inputs, makes_parents=True)
    manifest = _read_manifest(manifest_path)
    present = _existing_shards(out)
    if resume:
        if manifest is None:
            raise OutputExistsError(f"{manifest_path}: no manifest to resume from")
        return manifest
    if manifest is None and not present:
        return None
    if not overwrite:
        what = (
            manifest_path
            if manifest is not None
            else os.path.join(os.path.dirname(out), present[0])
        )
        raise OutputExistsError(
            f"{what}: already exists (use --resume to finish a killed export, or --overwrite "
            "to replace it)"
        )
    foreign = [n for n in present if n not in _listed(out, manifest)]
    if foreign:
        raise OutputExistsError(
            f"{os.path.join(os.path.dirname(out), foreign[0])}: not listed in "
            f"{manifest_path}; refusing to replace it (--overwrite replaces only shards an "
            "export wrote)"
        )
    return manifest


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
    found = _check_targets(out_path, inputs, overwrite, resume)
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
        _remove_stale_temporaries(out_path)
        with contextlib.ExitStack() as stack:
            reader = stack.enter_context(shared_reader(db_path))
            pair = None
            if labels_path is not None:
                label_reader = stack.enter_context(shared_reader(labels_path))
                pair = (TargetStream(db_path, labels_path, reader, label_reader), label_reader)
            if resume and found is not None:
                _check_resumable(out_path, found, options)
            return _write_shards(reader, db_path, out_path, found if resume else None,
                                 sorted(_listed(out_path, found)), options, names, progress,
                                 pair)  # fmt: skip
    except OSError as exc:
        remove_made(made)
        raise OutputError(
            f"{exc.filename or out_path}: cannot write: {exc.strerror or exc}"
        ) from None
    except BaseException:
        remove_made(made)
        raise


def _write_manifest(path: str, manifest: dict[str, Any]) -> None:
    with AtomicFile(path) as target:
        target.write((json.dumps(manifest, indent=1) + "\n").encode())
        target.commit()


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
        **({"targets": column_names(pair[0].width)} if pair is not None else {}),
        "complete": False,
        "shards": shards,
        "replacing": replacing,
    }
    manifest_path = manifest_name(out)
    if resumed is None:
        _write_manifest(manifest_path, manifest)  # before a shard is replaced
    before = sum(int(entry["records"]) for entry in shards)
    records: Iterator[tuple[bytes, bytes]]
    if shards:
        # The smallest key after the last one exported: the last key and a 0 byte.
        after = bytes.fromhex(shards[-1]["last_key_hex"]) + b"\0"
        records = reader.iter_from(after)
        if pair is not None:
            records = pair[0].records(records, pair[1].iter_from(after), start=before)
    else:
        records = iter(reader)
        if pair is not None:
            records = pair[0].records(records, pair[1])
    targets = pair[0] if pair is not None else None
    count, mapped = before, 0
    shard: _Shard | None = None
    previous = ""
    try:
        for sample in iter_samples(db_path, records):
            name, renamed = sample_key(sample.key)
            if name == previous:  # a loader groups consecutive members by name
                name, renamed = f"{name}_{count}", True
            previous = name
            members = sample_members(sample, name, renamed,
                                     targets.take() if targets is not None else None)  # fmt: skip
            size = sum(len(piece) for piece in members)
            if shard is not None and (
                shard.count >= options["shard_size"]
                or (options["shard_bytes"] and shard.size + size > options["shard_bytes"])
            ):
                shards.append(shard.finish())
                shard = None
                _write_manifest(manifest_path, manifest)
                progress(count, total)
            if shard is None:
                shard = _Shard(shard_name(out, len(shards)))
            shard.add(sample.key, members, size)
            count += 1
            mapped += renamed
        if shard is not None:
            shards.append(shard.finish())
            shard = None
    finally:
        if shard is not None:
            shard.file.discard()
    written = {entry["name"] for entry in shards}
    parent = os.path.dirname(out)
    for name in replacing:  # an earlier export's shards beyond this one's
        if name not in written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(parent, name))
    manifest["complete"] = True
    manifest["replacing"] = []
    manifest["records"] = count
    _write_manifest(manifest_path, manifest)
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
