"""The files of a WebDataset export beside ``OUT``: the shards' names (``OUT-000000.tar``),
the manifest (``OUT.shards.json``: read, proven ours, written atomically), the temporaries
a killed export left, and the checks made before any work (what exists, what may be
replaced, what a resume must find unchanged). Used by :mod:`mnist2db.exporting.webdataset.shards`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from mnist2db.errors import ArgumentError, OutputExistsError
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import TEMP_MARK, AtomicFile, remove_stale, temp_prefix

MANIFEST_FORMAT = "mnist2db webdataset shards"
_MANIFEST_LIMIT = 64 << 20
_HASH_CHUNK = 1 << 20


def shard_name(out: str, index: int) -> str:
    """The path of shard ``index``: ``OUT-000000.tar``."""
    return f"{out}-{index:06d}.tar"


def manifest_name(out: str) -> str:
    """The path of the manifest: ``OUT.shards.json``."""
    return f"{out}.shards.json"


def read_manifest(path: str) -> dict[str, Any] | None:
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


def listed_shards(out: str, manifest: dict[str, Any] | None) -> set[str]:
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


def existing_shards(out: str) -> list[str]:
    """The names ``OUT-NNNNNN.tar`` present beside ``out``."""
    parent = os.path.dirname(out) or os.curdir
    stem = os.path.basename(out)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(stem) and _SHARD_NAME.fullmatch(n[len(stem) :]))


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


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_resumable(out: str, manifest: dict[str, Any], options: dict[str, Any]) -> None:
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
            found = file_sha256(path)
        except OSError as exc:
            raise OutputExistsError(
                f"{path}: cannot resume: {exc.strerror} (use --overwrite to start again)"
            ) from None
        if found != entry["sha256"]:
            raise OutputExistsError(
                f"{path}: changed since it was written (SHA-256 {found[:16]}…, the manifest "
                f"has {entry['sha256'][:16]}…); cannot resume (use --overwrite to start again)"
            )


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
    manifest = read_manifest(manifest_path)
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
    foreign = [n for n in present if n not in listed_shards(out, manifest)]
    if foreign:
        raise OutputExistsError(
            f"{os.path.join(os.path.dirname(out), foreign[0])}: not listed in "
            f"{manifest_path}; refusing to replace it (--overwrite replaces only shards an "
            "export wrote)"
        )
    return manifest


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    with AtomicFile(path) as target:
        target.write((json.dumps(manifest, indent=1) + "\n").encode())
        target.commit()
