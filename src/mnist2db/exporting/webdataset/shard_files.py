"""The files of a WebDataset export beside ``OUT``: the shards' names (``OUT-000000.tar``),
the manifest (``OUT.shards.json``: read, proven ours, written atomically), the temporaries
a killed export left, and the checks made before any work (what exists, what may be
replaced; what a resume must find unchanged: :mod:`mnist2db.exporting.webdataset.resume_checks`). Used by
:mod:`mnist2db.exporting.webdataset.shards`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from mnist2db.errors import ArgumentError, OutputExistsError
from mnist2db.exporting.webdataset.tar_members import BLOCK, END_OF_ARCHIVE, first_member_is_ours
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import TEMP_MARK, AtomicFile, remove_stale, temp_prefix

MANIFEST_FORMAT = "mnist2db webdataset shards"
_MANIFEST_LIMIT = 64 << 20
#: The largest count or size a manifest may state (records, bytes): what a file can hold.
_COUNT_LIMIT = (1 << 63) - 1
_HEX = re.compile(r"(?:[0-9a-f]{2})*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def shard_name(out: str, index: int) -> str:
    """The path of shard ``index``: ``OUT-000000.tar``."""
    return f"{out}-{index:06d}.tar"


def manifest_name(out: str) -> str:
    """The path of the manifest: ``OUT.shards.json``."""
    return f"{out}.shards.json"


def read_manifest(path: str, out: str | None = None) -> dict[str, Any] | None:
    """The manifest at ``path`` when it is one of ours (every field checked:
    :func:`check_manifest`, with ``out`` its shards' prefix); None when there is none.

    Raises:
        OutputExistsError: it is not a regular file, not JSON, or not a manifest mnist2db
            writes (one line naming the field).
    """
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputExistsError(f"{path}: exists and is not a regular file")
            data = stream.read(_MANIFEST_LIMIT + 1)
        if len(data) > _MANIFEST_LIMIT:
            raise ValueError(f"larger than {_MANIFEST_LIMIT} bytes")
        found = json.loads(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise OutputExistsError(f"{path}: exists and is not a shard manifest ({exc})") from None
    if not isinstance(found, dict) or found.get("format") != MANIFEST_FORMAT:
        raise OutputExistsError(f"{path}: exists and is not a shard manifest of mnist2db")
    check_manifest(path, found, out if out is not None else path[: -len(".shards.json")])
    return found


class _Invalid(Exception):
    """A field of a manifest that is not as mnist2db writes it: its name and what is wrong."""


def _whole(low: int, high: int = _COUNT_LIMIT) -> tuple[str, Callable[[Any], bool]]:
    return (f"a whole number {low}..{high}", lambda v: type(v) is int and low <= v <= high)


_TEXT = ("a string", lambda v: type(v) is str)
_FLAG = ("true or false", lambda v: type(v) is bool)
_KEY_HEX = ("hex digits (a key)", lambda v: type(v) is str and _HEX.fullmatch(v) is not None)
_DIGEST = ("64 hex digits", lambda v: type(v) is str and _SHA256.fullmatch(v) is not None)
_TEXTS = ("a list of strings", lambda v: type(v) is list and all(type(x) is str for x in v))


def _field(obj: dict[str, Any], name: str, kind: tuple[str, Callable[[Any], bool]],
           shown: str | None = None, *, optional: bool = False) -> Any:  # fmt: skip
    """``obj[name]`` when it is of ``kind`` (a description and a test); else _Invalid."""
    if name not in obj:
        if optional:
            return None
        raise _Invalid(f"{shown or name}: missing")
    value = obj[name]
    if optional and value is None:
        return None
    if not kind[1](value):
        text = json.dumps(value)[:60] if _dumpable(value) else type(value).__name__
        raise _Invalid(f"{shown or name}: {text}, expected {kind[0]}")
    return value


def _dumpable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def shard_name_pattern(out: str) -> re.Pattern[str]:
    """The names mnist2db gives the shards of ``out``: ``OUT-NNNNNN.tar``, nothing else (no
    separator, no ``..``: the stem is ``out``'s own name)."""
    return re.compile(re.escape(os.path.basename(out)) + r"-(?:[0-9]{6}|[1-9][0-9]{6,})\.tar")


def check_manifest(path: str, manifest: dict[str, Any], out: str) -> None:
    """Refuse a manifest that is not as mnist2db writes one: read back, it is a stranger's
    input. Every field of its schema checked for its type and range, every name it lists
    one mnist2db gives a shard of ``out`` (the shards listed in order, ``OUT-000000.tar``
    first), their keys in order, their records within the shard size and the total.

    Raises:
        OutputExistsError: one line naming ``path`` and the field.
    """
    try:
        _check_fields(manifest, out)
    except _Invalid as exc:
        raise OutputExistsError(
            f"{path}: {exc}; not a manifest as mnist2db writes it (move it away, or export to "
            "another OUT)"
        ) from None


def _check_fields(manifest: dict[str, Any], out: str) -> None:
    if _field(manifest, "version", _whole(1, 1)) != 1:
        raise _Invalid("version: not 1")
    _field(manifest, "source", _TEXT)
    shard_size = _field(manifest, "shard_size", _whole(1))
    _field(manifest, "shard_bytes", _whole(1), optional=True)
    _field(manifest, "label_db", _TEXT, optional=True)
    records = _field(manifest, "records", _whole(0))
    _field(manifest, "classes", _TEXTS)
    _field(manifest, "targets", _TEXTS, optional=True)
    complete = _field(manifest, "complete", _FLAG)
    shards = _field(manifest, "shards", ("a list", lambda v: type(v) is list))
    replacing = _field(manifest, "replacing", _TEXTS)
    names = shard_name_pattern(out)
    for i, name in enumerate(replacing):
        if names.fullmatch(name) is None:
            raise _Invalid(f"replacing[{i}]: {json.dumps(name)[:60]} is not a shard name of "
                           f"{os.path.basename(out)} (OUT-NNNNNN.tar)")  # fmt: skip
    state = _field(manifest, "source_state", ("an object", lambda v: type(v) is dict),
                   optional=True)  # fmt: skip
    if state is not None:
        _field(state, "records", _whole(0), "source_state.records")
        _field(state, "first_key_hex", _KEY_HEX, "source_state.first_key_hex", optional=True)
        _field(state, "last_key_hex", _KEY_HEX, "source_state.last_key_hex", optional=True)
        _field(state, "digest", _DIGEST, "source_state.digest", optional=True)
    total, last = 0, None
    for i, entry in enumerate(shards):
        where = f"shards[{i}]"
        if type(entry) is not dict:
            raise _Invalid(f"{where}: not an object")
        name = _field(entry, "name", _TEXT, f"{where}.name")
        if name != os.path.basename(shard_name(out, i)):
            raise _Invalid(f"{where}.name: {json.dumps(name)[:60]}, expected "
                           f"{os.path.basename(shard_name(out, i))!r}")  # fmt: skip
        total += _field(entry, "records", _whole(1, shard_size), f"{where}.records")
        size = _field(entry, "bytes", _whole(len(END_OF_ARCHIVE)), f"{where}.bytes")
        if size % BLOCK:
            raise _Invalid(f"{where}.bytes: {size}, not a whole number of {BLOCK}-byte blocks")
        _field(entry, "sha256", _DIGEST, f"{where}.sha256")
        first = bytes.fromhex(_field(entry, "first_key_hex", _KEY_HEX, f"{where}.first_key_hex"))
        end = bytes.fromhex(_field(entry, "last_key_hex", _KEY_HEX, f"{where}.last_key_hex"))
        if end < first or (last is not None and first <= last):
            raise _Invalid(f"{where}: its keys are not after the shard before it, in order")
        last = end
    if total > records:
        raise _Invalid(f"shards: {total} records in all, more than records ({records})")
    if complete and (total != records or replacing):
        raise _Invalid("complete: true, but its shards do not hold its records")


_SHARD_NAME = re.compile(r"-[0-9]{6}\.tar")


def existing_shards(out: str) -> list[str]:
    """The names ``OUT-NNNNNN.tar`` present beside ``out``."""
    parent = os.path.dirname(out) or os.curdir
    stem = os.path.basename(out)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    pattern = shard_name_pattern(out)
    return sorted(n for n in names if n.startswith(stem) and pattern.fullmatch(n))


def remove_stale_temporaries(out: str) -> None:
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


def is_regular(path: str) -> bool:
    """True when ``path`` is a regular file (a link is not: never followed)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def first_block(path: str) -> bytes:
    """The first tar block of the regular file ``path`` (never through a link); b"" else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, BLOCK, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def pending_is_ours(out: str, manifest: dict[str, Any], next_key: bytes | None) -> bool:
    """Whether the shard after an incomplete manifest's last (placed before the manifest
    that would list it) is ours: a regular file beginning with a member as mnist2db writes
    them (mode 0644, owner 0, time 0), of the sample ``next_key`` when it is known."""
    if manifest.get("complete"):
        return False
    path = shard_name(out, len(manifest["shards"]))
    return first_member_is_ours(first_block(path), next_key)


def check_shard_names(out: str, manifest: dict[str, Any] | None, resume: bool,
                      next_key: bytes | None = None) -> list[str]:  # fmt: skip
    """Refuse every shard name beside ``out`` that mnist2db cannot prove it wrote: a link
    or anything but a regular file at any of them; a file the manifest does not list (on
    ``resume``: one it does not list as a shard, other than the one after its last when
    that is a shard of ours, of the record ``next_key``). Returns the names that may be
    replaced (shards of the earlier export)."""
    parent = os.path.dirname(out)
    present = existing_shards(out)
    for name in present:
        if not is_regular(os.path.join(parent, name)):
            raise OutputExistsError(
                f"{os.path.join(parent, name)}: is not a regular file (a link?); refusing to "
                "replace it (even with --overwrite)"
            )
    ours: set[str] = set()
    if manifest is not None:
        pending = os.path.basename(shard_name(out, len(manifest["shards"])))
        ours = {entry["name"] for entry in manifest["shards"]} | set(manifest["replacing"])
        # On a resume, a pending shard is of the record after the last listed, if any.
        provable = not resume or next_key is not None
        if pending in present and provable and pending_is_ours(out, manifest, next_key):
            ours.add(pending)
    for name in present:
        if name not in ours:
            option = "--resume" if resume else "--overwrite"
            raise OutputExistsError(
                f"{os.path.join(parent, name)}: not listed in {manifest_name(out)}; refusing "
                f"to replace it ({option} replaces only shards an export wrote)"
            )
    return sorted(ours & set(present))


def check_targets(
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
    manifest = read_manifest(manifest_path, out)
    present = existing_shards(out)
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
    check_shard_names(out, manifest, resume=False)
    return manifest


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    with AtomicFile(path) as target:
        target.write((json.dumps(manifest, indent=1) + "\n").encode())
        target.commit()
