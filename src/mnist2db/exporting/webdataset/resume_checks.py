"""The checks of what ``export --to webdataset --resume`` reads back before it goes on: the
source is the one the listed shards came from (:func:`source_state`, recorded in the
manifest), the shards' entries are the source's records in order and the shards' own
members, every shard unchanged (size, SHA-256). Read back, a manifest is a stranger's input
(its schema: :func:`mnist2db.exporting.webdataset.shard_files.check_manifest`). Used by
:mod:`mnist2db.exporting.webdataset.shards`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any

from mnist2db.errors import Mnist2dbError, OutputExistsError
from mnist2db.exporting.samples import sample_key
from mnist2db.exporting.webdataset.shard_files import (
    check_shard_names,
    first_block,
    is_regular,
    manifest_name,
)
from mnist2db.exporting.webdataset.tar_members import BLOCK, NAME_LIMIT, first_member_is_ours
from mnist2db.recipe import digest_of, load_metadata

_HASH_CHUNK = 1 << 20


def read_shard(path: str, walk: bool = True) -> tuple[str, int, bytes, bytes]:
    """A shard's SHA-256, and (``walk``) what its members say, read in the same pass: the
    number of samples (runs of members of one name before its first dot), the first's name
    and the last's (-1 samples when a header cannot be read: not a shard of ours). Chunks
    are whole blocks, so a header never straddles two."""
    digest = hashlib.sha256()
    samples, first, last = 0, b"", b""
    base = header = 0  # the chunk's offset in the file; the next header's
    ended = not walk
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
            end = base + len(chunk)
            while not ended and header < end:
                i = header - base
                if chunk[i] == 0:  # a name never begins with NUL: the end-of-archive
                    ended = True
                    break
                try:
                    if i + BLOCK > len(chunk):
                        raise ValueError("a header cut short")
                    size = int(chunk[i + 124 : i + 135], 8)
                except ValueError:
                    return digest.hexdigest(), -1, b"", b""
                dot = chunk.find(b".", i, i + NAME_LIMIT)
                stem = chunk[i:dot] if dot >= 0 else chunk[i : i + NAME_LIMIT].rstrip(b"\0")
                if stem != last or not samples:
                    samples += 1
                    first = first or stem
                    last = stem
                header += BLOCK + ((size + BLOCK - 1) // BLOCK) * BLOCK
            base = end
    return digest.hexdigest(), samples, first, last


def _names_key(stem: bytes, key_hex: str) -> bool:
    """Whether a sample named ``stem`` is the sample of the key ``key_hex``: its sample key,
    or that key made unique (``KEY_N``)."""
    name = sample_key(bytes.fromhex(key_hex))[0].encode("utf-8")
    return stem == name or (stem.startswith(name + b"_") and stem[len(name) + 1 :].isdigit())


def source_state(reader: Any) -> dict[str, Any]:
    """What tells ``reader``'s database apart from one converted again in its place: its
    count, first and last keys, and the digest of its records its ``mnist2db.json``
    records (None: it records none). Written in the manifest; a resume checks it."""
    digest = None
    try:
        loaded = load_metadata(reader)
    except Mnist2dbError:
        loaded = None  # not mnist2db's metadata: the keys and count alone tell
    if loaded is not None:
        found = digest_of(loaded[1])
        digest = None if found is None else found[1]
    first, last = reader.first_key(), reader.last_key()
    return {
        "records": len(reader),
        "first_key_hex": None if first is None else bytes(first).hex(),
        "last_key_hex": None if last is None else bytes(last).hex(),
        "digest": digest,
    }


def check_same_source(out: str, manifest: dict[str, Any], state: dict[str, Any],
                      reader: Any) -> None:  # fmt: skip
    """Refuse to resume onto a source other than the one the manifest's shards came from:
    its state (:func:`source_state`) and the last key exported, both as recorded."""
    path = manifest_name(out)
    recorded = manifest.get("source_state")
    if recorded is None:
        raise OutputExistsError(
            f"{path}: records no state of its source (an older export); cannot resume it "
            "(use --overwrite to start again)"
        )
    for name in ("records", "first_key_hex", "last_key_hex", "digest"):
        if recorded.get(name) != state[name]:
            raise OutputExistsError(
                f"{path}: its source had {name} {recorded.get(name)!r}, "
                f"{manifest.get('source')} has {state[name]!r} (converted again since?); "
                "cannot resume it (use --overwrite to start again)"
            )
    shards = manifest["shards"]
    if shards and reader.get(bytes.fromhex(shards[-1]["last_key_hex"])) is None:
        raise OutputExistsError(
            f"{path}: the last key exported ({shards[-1]['last_key_hex']} in hex) is not in "
            f"{manifest.get('source')}; cannot resume it (use --overwrite to start again)"
        )


def check_shard_keys(out: str, manifest: dict[str, Any], reader: Any) -> None:
    """Refuse shard entries whose keys and counts are not the source's records in order:
    each shard's first key the one after the shard before it (the database's first for
    shard 0), its last the one ``records`` keys on. One walk of the committed keys (no
    value read): a resume goes on after the last key, and counts from the records listed."""
    keys = reader.iter_keys()
    for i, entry in enumerate(manifest["shards"]):
        first, last, count = entry["first_key_hex"], entry["last_key_hex"], entry["records"]
        head = next(keys, None)
        # The keys between, skipped without a Python step each; then the shard's last.
        skipped = sum(1 for _ in itertools.islice(keys, count - 2)) if count > 2 else 0
        end = head if count == 1 else next(keys, None)
        if (
            head is None
            or end is None
            or skipped != max(0, count - 2)
            or bytes(head).hex() != first
            or bytes(end).hex() != last
        ):
            raise OutputExistsError(
                f"{manifest_name(out)}: shards[{i}] lists {count} records from key {first} to "
                f"{last} (hex), not the records of {manifest.get('source')} there; cannot "
                "resume it (use --overwrite to start again)"
            )


def check_resume(out: str, manifest: dict[str, Any], options: dict[str, Any],
                 state: dict[str, Any], reader: Any) -> list[str]:  # fmt: skip
    """Every check of what a resume reads back, before anything is touched: the source is
    the one the shards came from (:func:`check_same_source`), the options are the same and
    the shards unchanged (:func:`check_resumable`), and every other shard name is ours
    (:func:`check_shard_names`). Returns the names that may be replaced."""
    check_same_source(out, manifest, state, reader)
    check_shard_keys(out, manifest, reader)
    check_resumable(out, manifest, options)
    shards = manifest["shards"]
    if shards:
        after = bytes.fromhex(shards[-1]["last_key_hex"]) + b"\0"
        following = next(iter(reader.iter_from(after)), None)
        next_key = None if following is None else bytes(following[0])
    else:
        next_key = reader.first_key()
    return check_shard_names(out, manifest, True, next_key)


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
    shards = manifest["shards"]
    for index, entry in enumerate(shards):
        path = os.path.join(parent, entry["name"])
        try:
            if not is_regular(path):
                raise FileNotFoundError(0, "not a regular file (a link?)")
            size = os.lstat(path).st_size
            if size != entry["bytes"]:
                raise OutputExistsError(
                    f"{path}: {size} bytes, the manifest lists {entry['bytes']}; cannot "
                    "resume (use --overwrite to start again)"
                )
            # The last shard's members are walked (the resume goes on after its last key);
            # the others' keys are proved by the walk of the source's keys
            # (check_shard_keys: each shard's first the one after the last before) and their
            # first members.
            walked = index == len(shards) - 1
            found, samples, first, last = read_shard(path, walk=walked)
            if not walked:
                samples = entry["records"] if first_member_is_ours(
                    first_block(path), bytes.fromhex(entry["first_key_hex"])) else -1  # fmt: skip
                first = last = b""
        except OSError as exc:
            raise OutputExistsError(
                f"{path}: cannot resume: {exc.strerror} (use --overwrite to start again)"
            ) from None
        if found != entry["sha256"]:
            raise OutputExistsError(
                f"{path}: changed since it was written (SHA-256 {found[:16]}…, the manifest "
                f"has {entry['sha256'][:16]}…); cannot resume (use --overwrite to start again)"
            )
        # Its bytes are the ones listed; its entry's count and keys must be what they hold.
        if samples != entry["records"] or (
            walked
            and not (
                _names_key(first, entry["first_key_hex"])
                and _names_key(last, entry["last_key_hex"])
            )
        ):
            held = (
                f"holds {samples} samples, from {first.decode('utf-8', 'replace')!r} to "
                f"{last.decode('utf-8', 'replace')!r}"
                if walked
                else "does not begin with the sample of its first key"
            )
            raise OutputExistsError(
                f"{manifest_name(out)}: {entry['name']} {held}, not the {entry['records']} "
                "records its entry lists; cannot resume it (use --overwrite to start again)"
            )
