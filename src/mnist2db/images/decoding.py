"""One image file to one record, as Caffe's ``ReadImageToDatum`` makes it (:func:`image_record`,
for :class:`mnist2db.images.record_work.RecordWork`), or to its grey pixels
(:class:`PixelWork`): the work :mod:`mnist2db.images.workers` runs on worker processes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mnist2db.errors import printable
from mnist2db.formats.datum import datum_prefix
from mnist2db.formats.image import (
    decode_image,
    png_planes,
    read_image,
    to_chw,
)
from mnist2db.formats.image_encode import encode_image
from mnist2db.formats.image_input import check_fits_a_record, read_image_file
from mnist2db.formats.image_list import ListEntry
from mnist2db.formats.image_types import matches_ext
from mnist2db.formats.protowire import encode_varint
from mnist2db.formats.resize import resize_linear

if TYPE_CHECKING:
    import numpy as np


def image_record(
    entry: ListEntry,
    *,
    root: bytes,
    color: bool,
    resize: tuple[int, int] | None,
    encoding: str | None,
) -> tuple[bytes, tuple[int, int, int]]:
    """The Datum value of ``entry`` as Caffe's ``ReadImageToDatum`` writes it, and the
    decoded image's ``(channels, height, width)``.

    Raises:
        ImageError: the image cannot be read (Caffe skips it).
    """
    filename = root + entry.path
    label = b"\x28" + encode_varint(entry.label)
    contents = read_image_file(filename)
    if resize is None and encoding is None:
        check_fits_a_record(contents, 3 if color else 1, printable(os.fsdecode(filename)))
        planes = png_planes(contents, color)
        if planes is not None:
            data, shape = planes
            return datum_prefix(*shape, len(data)) + data + label + b"\x38\x00", shape
    image = decode_image(contents, color=color, where=os.fsdecode(filename))
    if resize is not None:
        image = resize_linear(image, resize[0], resize[1])
    height, width = int(image.shape[0]), int(image.shape[1])
    shape = (1 if image.ndim == 2 else int(image.shape[2]), height, width)
    if encoding is None:  # one copy of the pixels, into the record
        prefix = datum_prefix(*shape, shape[0] * height * width)
        return b"".join((prefix, to_chw(image).data, label, b"\x38\x00")), shape
    if resize is None and matches_ext(filename, encoding):
        data = contents
    else:
        data = encode_image(image, encoding)
    return b"\x22" + encode_varint(len(data)) + data + label + b"\x38\x01", shape


class PixelWork:
    """An entry to its grey pixels, ``(h, w)`` uint8, resized when asked (picklable)."""

    def __init__(self, root: bytes, resize: tuple[int, int] | None) -> None:
        self.root, self.resize = root, resize

    def __call__(self, entry: ListEntry) -> np.ndarray:
        image = read_image(self.root + entry.path, color=False)
        return image if self.resize is None else resize_linear(image, *self.resize)
