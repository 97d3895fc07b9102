"""WebDataset samples as USTAR tar members, built a batch at a time: each member a header
(mode 0644, owner 0, time 0: a shard's bytes depend on the records alone), its data and its
padding to a block, the bytes :mod:`tarfile` writes; the headers of a whole batch made in
one numpy pass. Used by :mod:`mnist2db.exporting.webdataset.shards`.
"""

from __future__ import annotations

import tarfile
from typing import Any

import numpy as np

from mnist2db.errors import OutputError
from mnist2db.exporting.float_labels import TargetStream, sample_json
from mnist2db.exporting.samples import SampleBatch, key_fields, plain_sample_keys, sample_key

#: A tar block: every header is one, every member's data is padded to a whole number.
BLOCK = 512
#: The end-of-archive marker: two blocks of zeros.
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def _ustar_template() -> bytes:
    """A USTAR header of an empty name and size 0 (mode 0644, owner 0, time 0, a regular
    file), its name, size and checksum fields zero."""
    info = tarfile.TarInfo("")
    info.mode, info.mtime = 0o644, 0
    header = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"\0" * 12  # size: filled per member
    header[148:156] = b"\0" * 8  # the checksum: filled per member
    return bytes(header)


_TEMPLATE = _ustar_template()
#: The checksum of a header is the sum of its bytes, its own field counted as 8 spaces:
#: the template's share is the same in every header, the rest is the name's bytes and the
#: size's digits (computed from the fields, never by summing a whole header).
_TEMPLATE_SUM = sum(_TEMPLATE) + 8 * ord(" ")


def first_member_is_ours(block: bytes, key: bytes | None = None) -> bool:
    """Whether ``block`` (a shard's first) is a header as :func:`ustar_headers` makes them
    (the template's mode, owner, time and type: a user's ``tar`` records its own), of a
    member of the sample of ``key`` when given: what proves a shard found under a name
    an export was writing to be that export's."""
    if len(block) != BLOCK or any(
        block[start:end] != _TEMPLATE[start:end]
        for start, end in ((100, 124), (136, 148), (156, BLOCK))
    ):
        return False
    if key is None:
        return True
    stem = sample_key(key)[0].encode("utf-8")  # then ".EXT", or "_N.EXT" (made unique)
    return block.startswith(stem) and block[len(stem) : len(stem) + 1] in (b".", b"_")


#: The padding after a member's data, by its length modulo a block.
PADDING = [b"\0" * (-n % BLOCK) for n in range(BLOCK)]
NAME_LIMIT = 100
_OCTAL_11 = 3 * np.arange(10, -1, -1)
_OCTAL_6 = 3 * np.arange(5, -1, -1)


def ustar_headers(names: list[bytes], sizes: list[int] | np.ndarray) -> bytes:
    """The USTAR headers of members named ``names`` (UTF-8, at most 100 bytes) holding
    ``sizes`` bytes, one block each, all at once: the template with the name, the size and
    the checksum in octal, as tarfile writes them."""
    return _header_blocks(names, sizes).tobytes()


def _header_blocks(names: list[bytes], sizes: list[int] | np.ndarray) -> np.ndarray:
    """:func:`ustar_headers` as an array, a header a row."""
    n = len(names)
    blocks = np.empty((n, BLOCK), np.uint8)
    blocks[:] = np.frombuffer(_TEMPLATE, np.uint8)
    lengths = set(map(len, names))
    if len(lengths) == 1:  # a batch's names often are (00000001.png, 00000001.cls)
        (length,) = lengths
        name_bytes = np.zeros((n, NAME_LIMIT), np.uint8)
        name_bytes[:, :length] = np.frombuffer(b"".join(names), np.uint8).reshape(n, length)
    else:
        joined = b"".join([name.ljust(NAME_LIMIT, b"\0") for name in names])
        name_bytes = np.frombuffer(joined, np.uint8).reshape(n, NAME_LIMIT)
    blocks[:, :NAME_LIMIT] = name_bytes
    digits = ((np.asarray(sizes, np.int64)[:, None] >> _OCTAL_11) & 7) + 48
    blocks[:, 124:135] = digits
    checksum = _TEMPLATE_SUM + name_bytes.sum(axis=1, dtype=np.int64) + digits.sum(axis=1)
    blocks[:, 148:154] = ((checksum[:, None] >> _OCTAL_6) & 7) + 48
    blocks[:, 155] = ord(" ")  # the checksum's six digits, a NUL, a space
    return blocks


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
    (the source key, the label, the targets: :func:`~mnist2db.exporting.float_labels.sample_json`);
    the headers of the whole batch made at once (:func:`ustar_headers`), the layout by numpy.
    Samples whose data are all below :data:`VIEW_SIZE` are joined into one buffer (raw
    records' PNGs); else each sample is its first member's header, its data as it is, and
    the rest.

    ``previous``: the name of the sample before (``count``: its number, plus one); a name
    equal to the one before is made unique (a loader groups consecutive members by name).
    """
    members = _plain_members(batch, previous) if targets is None else None
    if members is None:
        members = _members(batch, previous, count, targets)
    names, data, ends, mapped, previous = members
    if names and max(map(len, names)) > NAME_LIMIT:
        for member in names:
            if len(member) > NAME_LIMIT:
                member_name(member.decode())  # the refusal
    m = len(names)
    sizes = np.fromiter(map(len, data), np.int64, m)
    # Each member: a header block, its data, its padding to a block.
    spans = BLOCK + (sizes + (BLOCK - 1)) // BLOCK * BLOCK
    starts = np.zeros(m + 1, np.int64)
    np.cumsum(spans, out=starts[1:])
    offsets: list[int] = [0, *starts[ends].tolist()] if len(ends) else [0]
    framed = FramedBatch(offsets, mapped, previous)
    if not m:
        framed.blob = memoryview(b"")
        return framed
    headers = _header_blocks(names, sizes)
    if int(sizes.max()) < VIEW_SIZE:
        framed.blob = _joined(headers, data, sizes, starts).data
        return framed
    size_list = sizes.tolist()
    paddings = [PADDING[size % BLOCK] for size in size_list]
    view = memoryview(headers.tobytes())
    first = 0
    for stop in ends:
        rest: list[Any] = [paddings[first]]
        for j in range(first + 1, stop):
            rest += (view[j * BLOCK : (j + 1) * BLOCK], data[j], paddings[j])
        framed.parts += (view[first * BLOCK : (first + 1) * BLOCK], data[first], b"".join(rest))
        first = stop
    return framed


def _joined(
    headers: np.ndarray, data: list[Any], sizes: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """The members as one tar stream, laid out by whole blocks: each header at its member's
    start (``starts``: one block each, :func:`ustar_headers`), the blocks of its data,
    padded with zeros, in the blocks after it."""
    pieces: list[Any] = [b""] * (2 * len(data))
    pieces[0::2] = data
    pieces[1::2] = [PADDING[size % BLOCK] for size in sizes.tolist()]
    stream = np.empty((int(starts[-1]) // BLOCK, BLOCK), np.uint8)
    header_rows = starts[:-1] // BLOCK
    stream[header_rows] = headers
    data_rows = np.ones(len(stream), bool)
    data_rows[header_rows] = False
    stream[data_rows] = np.frombuffer(b"".join(pieces), np.uint8).reshape(-1, BLOCK)
    return stream.reshape(-1)  # sliced by bytes (FramedBatch.pieces)


#: A batch's members: their names and data, where each sample's end (an index into them),
#: whether each sample's name is mapped, and the last sample's name.
_Members = tuple[list[bytes], list[Any], list[int], list[bool], str]


def _plain_members(batch: SampleBatch, previous: str) -> _Members | None:
    """:func:`_members` without a loop of Python per sample, for a batch whose keys are all
    plain sample keys (:func:`~mnist2db.exporting.samples.sample_key`: the names are the
    keys, no ``KEY.json``) and whose first is not ``previous``; else None."""
    keys = batch.keys
    n = len(keys)
    if not n or not plain_sample_keys(keys) or keys[0].decode("ascii") == previous:
        return None
    names: list[bytes] = [b""] * (2 * n)
    exts = set(batch.exts)
    if len(exts) == 1:
        suffix = b"." + exts.pop().encode()
        names[0::2] = [key + suffix for key in keys]
    else:
        names[0::2] = [key + b"." + ext.encode() for key, ext in zip(keys, batch.exts, strict=True)]
    names[1::2] = [key + b".cls" for key in keys]
    data: list[Any] = [b""] * (2 * n)
    data[0::2] = batch.data
    data[1::2] = [b"%d" % label for label in batch.labels]
    return names, data, list(range(2, 2 * n + 1, 2)), [False] * n, keys[-1].decode("ascii")


def _members(
    batch: SampleBatch, previous: str, count: int, targets: TargetStream | None
) -> _Members:
    """Every sample's members (``NAME.EXT``, ``NAME.cls``, ``NAME.json`` when needed), one
    sample at a time."""
    names: list[bytes] = []
    data: list[Any] = []
    ends: list[int] = []
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
        ends.append(len(names))
        mapped.append(renamed)
    return names, data, ends, mapped, previous
