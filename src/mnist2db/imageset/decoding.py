"""One image file to one record, as Caffe's ``ReadImageToDatum`` makes it (:func:`image_record`,
for :class:`mnist2db.imageset.work.RecordWork`), or to its grey pixels
(:class:`PixelWork`): the work :mod:`mnist2db.imageset.workers.pool` runs on worker processes.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from mnist2db.errors import printable
from mnist2db.formats.datum.message import datum_prefix
from mnist2db.formats.imdecode.image_file import check_fits_a_record, read_image_file
from mnist2db.formats.imread.cv2_wheel import opencv
from mnist2db.formats.imread.encode_types import matches_ext
from mnist2db.formats.imread.imencode import encode_image
from mnist2db.formats.imread.reader import decode_image, image_shape, png_planes, read_image
from mnist2db.formats.imread.resize import resize_linear
from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.formats.protowire import encode_varint


def image_record(
    entry: ListEntry,
    *,
    root: bytes,
    color: bool,
    resize: tuple[int, int] | None,
    encoding: str | None,
) -> tuple[bytes | bytearray, tuple[int, int, int]]:
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
    if encoding is not None and resize is None and matches_ext(filename, encoding):
        # The file's own bytes: Caffe decodes them only to know that the image is readable.
        shape = image_shape(contents, color=color, where=os.fsdecode(filename))
        data = contents
    else:
        image = decode_image(contents, color=color, where=os.fsdecode(filename))
        if resize is not None:
            image = resize_linear(image, resize[0], resize[1])
        height, width = int(image.shape[0]), int(image.shape[1])
        shape = (1 if image.ndim == 2 else int(image.shape[2]), height, width)
        if encoding is None:
            return raw_record(image, shape, label), shape
        data = encode_image(image, encoding)
    return b"\x22" + encode_varint(len(data)) + data + label + b"\x38\x01", shape


def raw_record(image: np.ndarray, shape: tuple[int, int, int], label: bytes) -> bytearray:
    """The raw Datum of ``image`` (``(h, w)`` or ``(h, w, c)`` uint8): its pixels copied once,
    channel after channel, straight into the record (OpenCV's ``split`` where it is loaded
    already: a fifth of numpy's strided copy)."""
    channels, height, width = shape
    prefix = datum_prefix(channels, height, width, channels * height * width)
    tail = label + b"\x38\x00"
    start, stop = len(prefix), len(prefix) + channels * height * width
    record = bytearray(stop + len(tail))
    record[:start] = prefix
    record[stop:] = tail
    planes = np.frombuffer(record, np.uint8, stop - start, start).reshape(shape)
    cv2 = opencv() if "cv2" in sys.modules else None  # not loaded for this alone
    if channels == 1:
        planes[0] = image.reshape(height, width)
    elif cv2 is not None and image.flags.c_contiguous and channels <= 4:
        wanted = list(planes)
        got = cv2.split(image, wanted)
        # In place when the planes fit (they do): else the planes it made, copied in.
        for plane, made in zip(wanted, got, strict=True):
            if made.ctypes.data != plane.ctypes.data:
                plane[...] = made
    else:
        planes[...] = image.transpose(2, 0, 1)
    return record


class PixelWork:
    """An entry to its grey pixels, ``(h, w)`` uint8, resized when asked (picklable)."""

    def __init__(self, root: bytes, resize: tuple[int, int] | None) -> None:
        self.root, self.resize = root, resize

    def __call__(self, entry: ListEntry) -> np.ndarray:
        image = read_image(self.root + entry.path, color=False)
        return image if self.resize is None else resize_linear(image, *self.resize)
