"""How the records of one database become ``(image, label)``: alone, or many at once.

A database's first record tells its layout. Records in Caffe's fixed layout (the first
one's length, prefix and label byte) are checked and cut as columns of one matrix; PNG
records as mnist2db writes them are inflated as a batch (:mod:`mnist2db.reading.png_datums`);
anything else is decoded by protobuf and, for an encoded Datum, as Caffe's data layer
decodes it, on a few threads (:mod:`mnist2db.reading.threaded`). Where records come from
(keys, handles, processes) is :mod:`mnist2db.reading.datum_dataset`'s.
"""

from __future__ import annotations

import numpy as np

from mnist2db.errors import DatumError, Mnist2dbError
from mnist2db.formats.datum.message import datum_to_array, decode_datum, key_text, raw_layout
from mnist2db.formats.imdecode.png_decoder import decode_datum_image
from mnist2db.reading.png_datums import PngRecords, decode_png_record
from mnist2db.reading.threaded import decode_many, inflate_many

#: Bound once: decode()'s fixed-layout path looks them up per record.
_ndarray = np.ndarray
_uint8 = np.dtype(np.uint8)


class RecordDecoder:
    """The records of the database at ``path`` decoded, knowing its ``first`` record's
    layout: :attr:`layout` (Caffe's fixed layout, :func:`~mnist2db.formats.datum.message.raw_layout`)
    or :attr:`png` (PNG records as mnist2db writes them), or neither."""

    __slots__ = ("layout", "path", "png")

    def __init__(self, path: str, first: bytes | None) -> None:
        self.path = path
        self.layout: tuple[int, bytes, tuple[int, int, int], int] | None = (
            raw_layout(first) if first is not None else None
        )
        #: The layout of PNG records as mnist2db writes them.
        self.png: PngRecords | None = (
            PngRecords.from_record(first) if first is not None and self.layout is None else None
        )

    def decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        layout = self.layout
        if (
            layout is not None
            and len(value) == layout[0]
            and value[-2] == 0x28
            and value[-1] < 0x80
            and value.startswith(layout[1])
        ):
            return _ndarray(layout[2], _uint8, bytearray(value), layout[3]), value[-1]
        if layout is None:  # perhaps a PNG record as mnist2db writes them: no protobuf
            record = decode_png_record(value)
            if record is not None:
                return record
        where = f"{self.path}: key {key_text(key)}"
        try:
            datum = decode_datum(value)
            image = (
                decode_datum_image(datum.data, where) if datum.encoded else datum_to_array(datum)
            )
        except DatumError as exc:
            if str(exc).startswith(where):
                raise
            raise DatumError(f"{where}: {exc}") from None
        return image, int(datum.label)

    def stack(self, keys: list[bytes], values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The records as one image array and one label array.

        Raises:
            DatumError: the records do not all have one shape and dtype.
        """
        batch = self.batch(keys, values)
        if not isinstance(batch, list):
            return batch
        first = batch[0][0]
        key, image = next(
            (key, image)
            for key, (image, _) in zip(keys, batch, strict=True)
            if image.shape != first.shape or image.dtype != first.dtype
        )
        raise DatumError(
            f"{self.path}: key {key.decode(errors='replace')}: {image.dtype} {image.shape} "
            f"does not stack with the first record's {first.dtype} {first.shape}"
        )

    def batch(
        self, keys: list[bytes], values: list[bytes]
    ) -> tuple[np.ndarray, np.ndarray] | list[tuple[np.ndarray, int]]:
        """The records as one image array and one label array when they stack (one shape,
        one dtype), else the list of records, each decoded on its own."""
        layout = self.layout
        if layout is not None and values and set(map(len, values)) == {layout[0]}:
            # All of the first record's length: check the layout of all at once, as columns.
            n, (length, prefix, shape, offset) = len(values), layout
            matrix = np.frombuffer(b"".join(values), np.uint8).reshape(n, length)
            if (
                (matrix[:, :offset] == np.frombuffer(prefix, np.uint8)).all()
                and (matrix[:, -2] == 0x28).all()
                and (matrix[:, -1] < 0x80).all()
            ):
                size = shape[0] * shape[1] * shape[2]
                images = matrix[:, offset : offset + size].reshape(n, *shape).copy()
                return images, matrix[:, -1].astype(np.int64)

        png = self.png
        if png is not None and values:
            # PNG records: the batch read at once (formats.png_records), the others decoded
            # one by one, in order; one of another shape and the batch is decoded as below.
            images, labels, misses = png.read_many(values, inflate_many)
            for i in misses:
                image, labels[i] = self.decode(keys[i], values[i])
                if image.shape != images.shape[1:] or image.dtype != images.dtype:
                    break
                images[i] = image
            else:
                return images, np.array(labels, np.int64)

        records = decode_many(self.decode, keys, values)
        if not records:
            shape = layout[2] if layout is not None else png.shape if png is not None else (0, 0, 0)
            return np.empty((0, *shape), np.uint8), np.empty(0, np.int64)
        first = records[0][0]
        if any(image.shape != first.shape or image.dtype != first.dtype for image, _ in records):
            return records
        return np.stack([image for image, _ in records]), np.array(
            [label for _, label in records], np.int64
        )

    def decode_batch(
        self, keys: list[bytes], values: list[bytes]
    ) -> tuple[list[tuple[np.ndarray, int]], Mnist2dbError | None]:
        """The records decoded, in order, up to the first that fails, and its failure (None
        when none fails). PNG records in the first record's layout are read as one batch
        (their images: views of one array); the others one by one (several threads
        decode encoded ones)."""
        png = self.png
        if png is not None and values:
            images, labels, misses = png.read_many(values, inflate_many)
            records = list(zip(images, labels, strict=True))
            for i in misses:
                try:
                    records[i] = self.decode(keys[i], values[i])
                except Mnist2dbError as exc:
                    return records[:i], exc
            return records, None
        try:
            return decode_many(self.decode, keys, values), None
        except Mnist2dbError:
            pass
        done: list[tuple[np.ndarray, int]] = []
        for key, value in zip(keys, values, strict=True):
            try:
                done.append(self.decode(key, value))
            except Mnist2dbError as exc:
                return done, exc
        return done, None


def as_records(
    batch: tuple[np.ndarray, np.ndarray] | list[tuple[np.ndarray, int]],
) -> list[tuple[np.ndarray, int]]:
    """A batch as ``[(image, label), ...]``: the stacked images' views, Python int labels."""
    if isinstance(batch, list):
        return batch
    images, labels = batch
    return list(zip(images, labels.tolist(), strict=True))
