"""Raw records (pixels, not encoded bytes) as an export reads them: one record through
protobuf (:func:`raw_fields`), or a run of records in Caffe's fixed layout a batch at a
time, by numpy (:class:`FixedLayout`). Used by :mod:`mnist2db.exporting.sample_batches`, which
encodes them (grey images of one shape together:
:func:`~mnist2db.formats.png.encoder.encode_grey_pngs`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.formats.datum.message import datum_prefix

#: A raw record gathered for encoding: key, label, (channels, height, width), pixel bytes.
RawRecord = tuple[bytes, int, tuple[int, int, int], bytes]


class FixedRaws(NamedTuple):
    """Consecutive records of one :class:`FixedLayout`, as columns: ``keys``, ``labels`` and
    their pixels, ``images`` (uint8, ``(n, channels, height, width)``, contiguous)."""

    keys: list[bytes]
    labels: list[int]
    images: np.ndarray


def raw_fields(datum: Any, key: bytes, where: str) -> RawRecord:
    """A raw Datum's fields, checked to be an image an image file can hold."""
    shape = (int(datum.channels), int(datum.height), int(datum.width))
    if not len(datum.data):
        raise DatumError(
            f"{where}: float_data pixels, not an image an image file can hold "
            "(export --to idx writes uint8 records only as well)"
        )
    _check_shape(shape, where)
    return key, int(datum.label), shape, datum.data


def _check_shape(shape: tuple[int, int, int], where: str) -> None:
    """Refuse, naming ``where``, a shape no image file of ours holds (1 or 3 channels)."""
    channels, height, width = shape
    if channels not in (1, 3) or height == 0 or width == 0:
        raise DatumError(
            f"{where}: Datum {channels} × {height} × {width}: an image file holds 1 channel "
            "(grey) or 3 (colour) of at least 1 × 1 pixels"
        )


class FixedLayout:
    """Caffe's fixed record layout (what :func:`mnist2db.formats.datum.message.raw_layout` finds),
    learnt from the first raw record without protobuf (:meth:`of`): records of that length
    and prefix, ending in a one-byte label, are read a batch at a time (:meth:`read`)."""

    def __init__(self, length: int, prefix: bytes, shape: tuple[int, int, int]) -> None:
        self.length, self.prefix, self.shape, self.offset = length, prefix, shape, len(prefix)
        self.size = shape[0] * shape[1] * shape[2]

    @classmethod
    def of(cls, value: Any) -> FixedLayout | None:
        """The layout of ``value`` when it is a record in it (``channels``, ``height``,
        ``width``, ``data`` of as many pixels and a label below 128, each field as protobuf
        writes it: what :func:`~mnist2db.formats.datum.message.raw_layout` accepts), else None."""
        fields = []
        i = 0
        for tag in (0x08, 0x10, 0x18, 0x22):
            if i >= len(value) or value[i] != tag:
                return None
            number, i = _varint(value, i + 1)
            if i < 0:
                return None
            fields.append(number)
        channels, height, width, size = fields
        shape = (channels, height, width)
        if min(shape) <= 0 or size != channels * height * width:
            return None
        prefix = datum_prefix(channels, height, width, size)
        length = len(prefix) + size + 2
        if len(value) != length or value[-2] != 0x28 or value[-1] >= 0x80:
            return None
        if bytes(value[: len(prefix)]) != prefix:  # not protobuf's own bytes for the fields
            return None
        return cls(length, prefix, shape)

    def read(self, keys: list[bytes], values: list[Any]) -> FixedRaws | None:
        """The records ``keys``, ``values`` (each :attr:`length` bytes), when every one is in
        this layout; else None (to be read one by one)."""
        n = len(values)
        rows = np.frombuffer(b"".join(values), np.uint8).reshape(n, self.length)
        prefix = np.frombuffer(self.prefix, np.uint8)
        if not (
            (rows[:, -2] == 0x28).all()
            and (rows[:, -1] < 0x80).all()
            and (rows[:, : len(prefix)] == prefix).all()
        ):
            return None
        pixels = rows[:, self.offset : self.offset + self.size]
        images = np.ascontiguousarray(pixels).reshape(n, *self.shape)
        return FixedRaws(keys, rows[:, -1].tolist(), images)


def _varint(value: Any, i: int) -> tuple[int, int]:
    """The varint at ``value[i]`` (at most 10 bytes) and the index after it; ``(0, -1)`` when
    it is cut short or longer."""
    number = shift = 0
    for j in range(i, min(len(value), i + 10)):
        byte = value[j]
        number |= (byte & 0x7F) << shift
        if byte < 0x80:
            return number, j + 1
        shift += 7
    return 0, -1
