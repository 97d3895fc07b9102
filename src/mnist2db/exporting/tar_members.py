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


#: A member's data at least this large is left where it is (an encoded record's bytes, a
#: batch's own bytes: never copied here); a batch of smaller ones is joined.
VIEW_SIZE = 16 << 10


class FramedBatch:
    """A batch's samples as their bytes in a tar, one after another: sample ``i`` is bytes
    ``offsets[i]`` to ``offsets[i + 1]`` of the batch's stream, :meth:`pieces` gives the
    buffers of samples ``i`` to ``j``; ``mapped``: whether each sample's name is not its
    key; ``last``: the last sample's name."""

    def __init__(self, offsets: list[int], mapped: list[bool], last: str) -> None:
        self.offsets = offsets
        self.mapped = mapped
        self.last = last
        self.blob: memoryview | None = None  # every sample's bytes joined
        self.parts: list[Any] = []  # or three buffers a sample: header, data, the rest

    def pieces(self, i: int, j: int) -> list[Any]:
        if self.blob is not None:
            return [self.blob[self.offsets[i] : self.offsets[j]]]
        return self.parts[3 * i : 3 * j]


def batch_tars(
    batch: SampleBatch, previous: str, count: int, targets: TargetStream | None = None
) -> FramedBatch:
    """Each sample of ``batch`` as its bytes in a tar: the members ``NAME.EXT``,
    ``NAME.cls``, and ``NAME.json`` when the name is not the key or there are ``targets``
    (the source key, the label, the targets: :func:`~mnist2db.exporting.targets.sample_json`);
    the headers of the whole batch made at once (:func:`ustar_headers`). Samples whose data
    are all below :data:`VIEW_SIZE` are joined into one buffer (raw records' PNGs); else
    each sample is its first member's header, its data as it is, and the rest.

    ``previous``: the name of the sample before (``count``: its number, plus one); a name
    equal to the one before is made unique (a loader groups consecutive members by name).
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
    sizes = [len(piece) for piece in data]
    headers = memoryview(ustar_headers(names, sizes) if names else b"")
    offsets = [0]
    end = 0
    start = 0
    for stop in members:
        for j in range(start, stop):
            end += BLOCK + sizes[j] + len(PADDING[sizes[j] % BLOCK])
        offsets.append(end)
        start = stop
    framed = FramedBatch(offsets, mapped, previous)
    if not data or max(sizes) < VIEW_SIZE:
        pieces: list[Any] = []
        for j, piece in enumerate(data):
            pieces += (headers[j * BLOCK : (j + 1) * BLOCK], piece, PADDING[sizes[j] % BLOCK])
        framed.blob = memoryview(b"".join(pieces))
        return framed
    start = 0
    for stop in members:
        rest: list[Any] = [PADDING[sizes[start] % BLOCK]]
        for j in range(start + 1, stop):
            rest += (headers[j * BLOCK : (j + 1) * BLOCK], data[j], PADDING[sizes[j] % BLOCK])
        framed.parts += (headers[start * BLOCK : (start + 1) * BLOCK], data[start], b"".join(rest))
        start = stop
    return framed
