"""Which records ``show`` draws: a range of an IDX image file (with its labels) or of a
Datum database, streamed a batch at a time; :mod:`mnist2db.render` draws them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from mnist2db.errors import ArgumentError, DatumError, IdxFormatError, RecordIndexError
from mnist2db.formats.datum.message import datum_to_array, decode_datum, key_text
from mnist2db.formats.idx.header import check_pair
from mnist2db.formats.idx.reader import open_idx
from mnist2db.formats.imdecode.png_decoder import decode_datum_image
from mnist2db.formats.png.encoder import PNG_SIGNATURE
from mnist2db.reading.datum_dataset import DatumDataset
from mnist2db.reading.open import open_db
from mnist2db.selection import check_label_column, check_range
from mnist2db.storage.databases.backends import DEFAULT_BATCH_SIZE as _BATCH
from mnist2db.storage.databases.readers import shared_reader


@dataclass(frozen=True)
class Record:
    """One item to show: its position, its key (databases only), label and image."""

    index: int
    key: bytes | None
    label: int | None
    image: np.ndarray  # (channels, height, width)


def find_labels(images: str | os.PathLike[str]) -> str | None:
    """The label file beside an image file, found by name (``*-images-idx3-ubyte[.gz]`` ->
    ``*-labels-idx1-ubyte`` or QMNIST's ``*-labels-idx2-int``, plain, ``.gz`` or ``.xz``),
    or None."""
    directory, name = os.path.split(os.fspath(images))
    if "images" not in name:
        return None
    stem = name.removesuffix(".gz").removesuffix(".xz").replace("images", "labels")
    for labels in (stem.replace("idx3", "idx1"), stem.replace("idx3-ubyte", "idx2-int")):
        for candidate in (labels, labels + ".gz", labels + ".xz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                return path
    return None


#: ``check_size(index, selected, channels, height, width)``: called before a record's pixels
#: are read or decoded (``selected``: how many records will be shown); raises to refuse it
#: (see :func:`select_records`).
SizeCheck = Callable[[int, int, int, int, int], None]

#: Bytes of IDX images read per step (a batch is also at most _BATCH images).
_BATCH_BYTES = 16 << 20


def select_records(
    source: str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    offset: int = 0,
    count: int = 10,
    transpose: bool = False,
    label_column: int = 0,
    check_size: SizeCheck | None = None,
) -> tuple[int, Iterator[Record]]:
    """The records ``offset`` to ``offset + count`` of an IDX image file or a database.

    Checks happen before this returns; the records are then read as the iterator runs.

    Args:
        source: an IDX image file (uint8, count × rows × cols) or a database directory.
        labels: the IDX label file for an image file; None looks for it beside ``source``
            (see :func:`find_labels`) and shows no labels when there is none.
        offset: the first record, from 0.
        count: at most this many records; fewer when the source ends first.
        transpose: swap each image's height and width.
        label_column: the label column of a QMNIST idx2-int label file.
        check_size: called as ``check_size(index, selected, channels, height, width)``
            (``selected``: the number of records shown; the size as shown, after
            ``transpose``) before a record's pixels are read or decoded, from
            what the source declares: the IDX header (once, before this returns), a
            Datum's fields, an encoded image's PNG header. It raises to refuse a record too
            large to draw, before the memory is spent.

    Returns:
        ``(total, records)``: the number of records in the source, and the selected ones.

    Raises:
        IdxFormatError: the IDX file is not uint8 images, or the pair does not match.
        BackendError: a directory that is not a database.
        RecordIndexError: ``offset`` is past the end.
    """
    if offset < 0 or count < 0:
        raise ArgumentError("offset and count must not be negative")
    path = os.fspath(source)
    if os.path.isdir(path):
        db = open_db(path)
        total = len(db)
        try:
            _check_start(path, total, offset, count, "records")
        except BaseException:
            db.close()
            raise
        stop = min(offset + count, total)
        return total, _db_records(db, offset, stop, transpose, check_size)

    images_reader = open_idx(path)
    header = images_reader.header
    labels_path = os.fspath(labels) if labels is not None else find_labels(path)
    try:
        if header.type_code != 0x08 or len(header.dims) != 3:
            raise IdxFormatError(
                f"{path}: cannot show {header.describe()} data: expected uint8 images "
                f"(magic 0x00000803, count × rows × cols), found magic 0x{header.magic:08x}"
            )
        labels_reader = open_idx(labels_path) if labels_path is not None else None
    except BaseException:
        images_reader.close()
        raise
    total = header.count
    rows, cols = header.dims[1], header.dims[2]
    try:
        if labels_reader is not None:
            check_pair(header, labels_reader.header, label_rows=True)
            check_label_column(labels_reader.header, label_column)
        _check_start(path, total, offset, count, "images")
        if check_size is not None and count and offset < total:
            selected = min(count, total - offset)
            check_size(offset, selected, 1, *((cols, rows) if transpose else (rows, cols)))
    except BaseException:
        images_reader.close()
        if labels_reader is not None:
            labels_reader.close()
        raise
    # Images are read a batch at a time: at most _BATCH of them and about _BATCH_BYTES.
    batch = max(1, min(_BATCH, _BATCH_BYTES // max(1, rows * cols)))

    def idx_records() -> Iterator[Record]:
        stop = min(offset + count, total)
        try:
            label_batches = labels_reader.iter_batches(batch) if labels_reader is not None else None
            start = 0
            for images in images_reader.iter_batches(batch):
                label_batch = next(label_batches) if label_batches is not None else None
                end = start + len(images)
                for i in range(max(start, offset), min(end, stop)):
                    label = None
                    if label_batch is not None:
                        row = label_batch[i - start]
                        label = int(row[label_column] if row.ndim else row)
                    image = images[i - start]
                    yield Record(i, None, label, (image.T if transpose else image)[None].copy())
                start = end
                if start >= stop:
                    break
        finally:
            images_reader.close()
            if labels_reader is not None:
                labels_reader.close()

    return total, idx_records()


def _db_records(
    db: DatumDataset, start: int, stop: int, transpose: bool, check_size: SizeCheck | None
) -> Iterator[Record]:
    """Records ``start`` to ``stop`` of ``db`` in key order, each checked by ``check_size``
    on its declared size before its pixels are decoded (an encoded image) or copied."""
    with db, shared_reader(db.path, db.backend) as reader:
        if start >= stop:
            return
        index = start
        for raw_key, value in reader.iter_from(db.key(start)):
            if index >= stop:
                break
            key = bytes(raw_key)
            where = f"{db.path}: key {key_text(key)}"
            declared = declared_shape(value)
            if check_size is not None and declared is not None:
                channels, height, width = declared
                shown = (width, height) if transpose else (height, width)
                check_size(index, stop - start, channels, *shown)
            try:
                datum = decode_datum(value)
            except DatumError as exc:
                raise DatumError(f"{where}: {exc}") from None
            del value
            if datum.encoded:
                image = decode_datum_image(datum.data, where)
            elif not len(datum.data) and not len(datum.float_data):
                raise DatumError(f"{where}: an empty Datum (no data, no float_data): no image")
            else:
                try:
                    image = datum_to_array(datum)
                except (DatumError, ValueError) as exc:
                    raise DatumError(f"{where}: {exc}") from None
            if transpose:
                image = image.transpose(0, 2, 1)
            yield Record(index, key, int(datum.label), image)
            index += 1


#: Channels of a decoded PNG by its colour type (as OpenCV gives them: grey 1, colour and
#: palette 3, with alpha 4).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}


def declared_shape(value: bytes) -> tuple[int, int, int] | None:
    """``(channels, height, width)`` a stored Datum declares, read without decoding or
    copying its pixels: from its fields, or, for an encoded image, from the PNG header at
    the start of its data. None when the value does not say (not a Datum, negative sizes,
    an image that is not a PNG): the record is then checked once decoded.
    """
    view = memoryview(value)
    fields: dict[int, int] = {}
    data_at, data_length = 0, 0
    position, end = 0, len(view)
    try:
        while position < end:
            tag, position = _varint(view, position)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                fields[number], position = _varint(view, position)
            elif wire == 2:
                length, position = _varint(view, position)
                if number == 4:
                    data_at, data_length = position, length
                position += length
            elif wire in (1, 5):
                position += 8 if wire == 1 else 4
            else:
                return None
    except IndexError:
        return None
    if position != end:
        return None
    if fields.get(7):  # encoded: the image's own header says
        head = bytes(view[data_at : data_at + min(data_length, 26)])
        if len(head) < 26 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
            return None
        width, height = struct.unpack(">II", head[16:24])
        return _PNG_CHANNELS.get(head[25], 1), height, width
    shape = tuple(fields.get(n, 0) for n in (1, 2, 3))
    if any(d >= 1 << 31 for d in shape):  # a negative int32, or not an int32 at all
        return None
    return shape[0], shape[1], shape[2]


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    """A protobuf varint at ``position``: its value and the position after it."""
    value = shift = 0
    while True:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _check_start(path: str, total: int, offset: int, count: int, unit: str) -> None:
    """The range check ``convert`` makes (:func:`mnist2db.selection.check_range`), where the
    range may stop early; raised as RecordIndexError (an IndexError too)."""
    try:
        check_range(path, total, offset, count, clip=True, unit=unit)
    except IdxFormatError as exc:
        raise RecordIndexError(str(exc)) from None
