"""Which records ``show`` draws: a range of an IDX image file (with its labels) or of a
Datum database, streamed a batch at a time; :mod:`mnist2db.render` draws them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mnist2db.dataset import open_db
from mnist2db.errors import ArgumentError, IdxFormatError, RecordIndexError
from mnist2db.formats.idx import check_pair
from mnist2db.formats.idx_reader import open_idx
from mnist2db.records import check_label_column, check_range
from mnist2db.storage.backends import DEFAULT_BATCH_SIZE as _BATCH


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


def select_records(
    source: str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    offset: int = 0,
    count: int = 10,
    transpose: bool = False,
    label_column: int = 0,
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

        def db_records() -> Iterator[Record]:
            with db:
                for index, key, image, label in db.records(offset, offset + count):
                    if transpose:
                        image = image.transpose(0, 2, 1)
                    yield Record(index, key, label, image)

        return total, db_records()

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
    try:
        if labels_reader is not None:
            check_pair(header, labels_reader.header, label_rows=True)
            check_label_column(labels_reader.header, label_column)
        _check_start(path, total, offset, count, "images")
    except BaseException:
        images_reader.close()
        if labels_reader is not None:
            labels_reader.close()
        raise

    def idx_records() -> Iterator[Record]:
        stop = min(offset + count, total)
        try:
            label_batches = (
                labels_reader.iter_batches(_BATCH) if labels_reader is not None else None
            )
            start = 0
            for batch in images_reader.iter_batches(_BATCH):
                label_batch = next(label_batches) if label_batches is not None else None
                end = start + len(batch)
                for i in range(max(start, offset), min(end, stop)):
                    label = None
                    if label_batch is not None:
                        row = label_batch[i - start]
                        label = int(row[label_column] if row.ndim else row)
                    image = batch[i - start]
                    yield Record(i, None, label, (image.T if transpose else image)[None].copy())
                start = end
                if start >= stop:
                    break
        finally:
            images_reader.close()
            if labels_reader is not None:
                labels_reader.close()

    return total, idx_records()


def _check_start(path: str, total: int, offset: int, count: int, unit: str) -> None:
    """The range check ``convert`` makes (:func:`mnist2db.records.check_range`), where the
    range may stop early; raised as RecordIndexError (an IndexError too)."""
    try:
        check_range(path, total, offset, count, clip=True, unit=unit)
    except IdxFormatError as exc:
        raise RecordIndexError(str(exc)) from None
