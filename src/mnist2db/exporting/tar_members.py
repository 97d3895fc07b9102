"""WebDataset samples as USTAR tar members, built a batch at a time: each member a header
(mode 0644, owner 0, time 0: a shard's bytes depend on the records alone), its data and its
padding to a block, the bytes :mod:`tarfile` writes; the headers of a whole batch made in
one numpy pass. Used by :mod:`mnist2db.exporting.shards`.
"""

from __future__ import annotations

import tarfile
from typing import Any

import numpy as np

from mnist2db.errors import OutputError
from mnist2db.exporting.samples import SampleBatch, key_fields, sample_key
from mnist2db.exporting.targets import TargetStream, sample_json

#: A tar block: every header is one, every member's data is padded to a whole number.
BLOCK = 512
#: The end-of-archive marker: two blocks of zeros.
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def _ustar_template() -> bytes:
    """A USTAR header of an empty name and size 0 (mode 0644, owner 0, time 0, a regular
    file), its checksum field blank (spaces, as the checksum counts it)."""
    info = tarfile.TarInfo("")
    info.mode, info.mtime = 0o644, 0
    header = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"\0" * 12  # size: filled per member
    header[148:156] = b" " * 8  # the checksum counts its own field as spaces
    return bytes(header)


_TEMPLATE = _ustar_template()


#: The padding after a member's data, by its length modulo a block.
PADDING = [b"\0" * (-n % BLOCK) for n in range(BLOCK)]
NAME_LIMIT = 100
_OCTAL_11 = 3 * np.arange(10, -1, -1)
_OCTAL_6 = 3 * np.arange(5, -1, -1)


def ustar_headers(names: list[bytes], sizes: list[int]) -> bytes:
    """The USTAR headers of members named ``names`` (UTF-8, at most 100 bytes) holding
    ``sizes`` bytes, one block each, all at once: the template with the name, the size and
    the checksum (the sum of the header's bytes, its own field counted as spaces) in
    octal, as tarfile writes them."""
    n = len(names)
    blocks = np.empty((n, BLOCK), np.uint8)
    blocks[:] = np.frombuffer(_TEMPLATE, np.uint8)
    joined = b"".join([name.ljust(NAME_LIMIT, b"\0") for name in names])
    blocks[:, :NAME_LIMIT] = np.frombuffer(joined, np.uint8).reshape(n, NAME_LIMIT)
    size = np.array(sizes, np.int64)[:, None]
    blocks[:, 124:135] = ((size >> _OCTAL_11) & 7) + 48
    blocks[:, 135] = 0
    checksum = blocks.sum(axis=1, dtype=np.int64)[:, None]
    blocks[:, 148:154] = ((checksum >> _OCTAL_6) & 7) + 48
    blocks[:, 154] = 0
    return blocks.tobytes()


def member_name(name: str) -> bytes:
    encoded = name.encode("utf-8")
    if len(encoded) > NAME_LIMIT:
        raise OutputError(f"{name}: a member name over 100 bytes (a USTAR limit)")
    return encoded


def tar_member(name: str, data: bytes) -> list[bytes]:
    """One USTAR member (header, data, padding), as tarfile writes it."""
    return [ustar_headers([member_name(name)], [len(data)]), data, PADDING[len(data) % BLOCK]]


#: A sample's bytes in a tar: the first member's header, its data as it is (a view of the
#: record: never copied here), then its padding and the other members (header, data, padding).
SampleTar = tuple[bytes, Any, bytes]


def batch_tars(
    batch: SampleBatch, previous: str, count: int, targets: TargetStream | None = None
) -> tuple[list[SampleTar], list[bool], str]:
    """Each sample of ``batch`` as its bytes in a tar (:data:`SampleTar`): the members
    ``NAME.EXT``, ``NAME.cls``, and ``NAME.json`` when the name is not the key or there are
    ``targets`` (the source key, the label, the targets:
    :func:`~mnist2db.exporting.targets.sample_json`); the headers of the whole batch made at
    once (:func:`ustar_headers`).

    ``previous``: the name of the sample before (``count``: its number, plus one); a name
    equal to the one before is made unique (a loader groups consecutive members by name).
    Returns the samples' bytes, whether each name is mapped, and the last name.
    """
    names: list[bytes] = []
    data: list[Any] = []
    members: list[int] = []
    mapped: list[bool] = []
    for i, key in enumerate(batch.keys):
        name, renamed = sample_key(key)
        if name == previous:
            name, renamed = f"{name}_{count + i}", True
        previous = name
        stem = name.encode()
        label = batch.labels[i]
        names += (stem + b"." + batch.exts[i].encode(), stem + b".cls")
        data += (batch.data[i], b"%d" % label)
        values = targets.take() if targets is not None else None
        if renamed or values is not None:
            names.append(stem + b".json")
            data.append(sample_json(key_fields(key), label, values))
        members.append(len(names))
        mapped.append(renamed)
    for member in names:
        if len(member) > NAME_LIMIT:
            member_name(member.decode())  # the refusal
    headers = ustar_headers(names, [len(piece) for piece in data]) if names else b""
    tars: list[SampleTar] = []
    start = 0
    for end in members:
        first = data[start]
        rest = [PADDING[len(first) % BLOCK]]
        for j in range(start + 1, end):
            piece = data[j]
            rest += (headers[j * BLOCK : (j + 1) * BLOCK], piece, PADDING[len(piece) % BLOCK])
        tars.append((headers[start * BLOCK : (start + 1) * BLOCK], first, b"".join(rest)))
        start = end
    return tars, mapped, previous
