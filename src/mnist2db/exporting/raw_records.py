"""Raw records (pixels, not encoded bytes) as an export reads them: one record through
protobuf (:func:`raw_fields`), or a run of records in Caffe's fixed layout a batch at a
time, by numpy (:class:`FixedLayout`). Used by :mod:`mnist2db.exporting.samples`, which
encodes them (grey images of one shape together:
:func:`~mnist2db.formats.png.encode_grey_pngs`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.formats.datum import raw_layout

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
    check_shape(shape, where)
    return key, int(datum.label), shape, datum.data


def check_shape(shape: tuple[int, int, int], where: str) -> None:
    """Refuse, naming ``where``, a shape no image file of ours holds (1 or 3 channels)."""
    channels, height, width = shape
    if channels not in (1, 3) or height == 0 or width == 0:
        raise DatumError(
            f"{where}: Datum {channels} × {height} × {width}: an image file holds 1 channel "
            "(grey) or 3 (colour) of at least 1 × 1 pixels"
        )


class FixedLayout:
    """Caffe's fixed record layout (:func:`mnist2db.formats.datum.raw_layout`), learnt from
    the first raw record: records of that length and prefix, ending in a one-byte label,
    are read without protobuf, a batch at a time (:meth:`read`)."""

    def __init__(self, value: bytes) -> None:
        found = raw_layout(value)
        self.length, self.prefix, self.shape, self.offset = found or (-1, b"", (0, 0, 0), 0)
        self.size = self.shape[0] * self.shape[1] * self.shape[2]

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
