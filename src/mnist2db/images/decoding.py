"""One image file to one record, as Caffe's ``ReadImageToDatum`` makes it (:class:`RecordWork`),
or to its grey pixels (:class:`PixelWork`): the work :mod:`mnist2db.images.workers` runs on
worker processes.
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
from mnist2db.formats.protowire import encode_varint
from mnist2db.formats.resize import resize_linear

if TYPE_CHECKING:
    import numpy as np


def encoding_of(entry: ListEntry, encode_type: str | None) -> str:
    """The type ``entry``'s record is encoded as: ``encode_type``, or Caffe's guess, the
    path's extension in lower case."""
    if encode_type:
        return encode_type.lower()
    path = entry.path
    dot = path.rfind(b".")
    return os.fsdecode(path[dot + 1 :] if dot >= 0 else path).lower()


def matches_ext(filename: bytes, encoding: str) -> bool:
    """Caffe's ``matchExt``: the file's extension (after its last dot) is the encoding."""
    dot = filename.rfind(b".")
    ext = os.fsdecode(filename[dot + 1 :] if dot >= 0 else filename).lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


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


class RecordWork:
    """An entry to its record (picklable, for worker processes)."""

    def __init__(
        self,
        root: bytes,
        color: bool,
        resize: tuple[int, int] | None,
        encoded: bool,
        encode_type: str | None,
    ) -> None:
        self.root, self.color, self.resize = root, color, resize
        self.encoded, self.encode_type = encoded, encode_type

    def __call__(self, entry: ListEntry) -> tuple[bytes, tuple[int, int, int]]:
        encoding = encoding_of(entry, self.encode_type) if self.encoded else None
        return image_record(
            entry, root=self.root, color=self.color, resize=self.resize, encoding=encoding
        )


class PixelWork:
    """An entry to its grey pixels, ``(h, w)`` uint8, resized when asked (picklable)."""

    def __init__(self, root: bytes, resize: tuple[int, int] | None) -> None:
        self.root, self.resize = root, resize

    def __call__(self, entry: ListEntry) -> np.ndarray:
        image = read_image(self.root + entry.path, color=False)
        return image if self.resize is None else resize_linear(image, *self.resize)
