"""The reading API's one door: :func:`open_db`, a database (and, when given, its label
database) opened as a dataset (:mod:`mnist2db.reading.datum_dataset`,
:mod:`mnist2db.reading.labeled_dataset`)."""

from __future__ import annotations

import os
from typing import overload

from mnist2db.reading.datum_dataset import DatumDataset
from mnist2db.reading.labeled_dataset import LabeledDataset


@overload
def open_db(
    path: str | os.PathLike[str], backend: str | None = None, *, labels: None = None
) -> DatumDataset: ...


@overload
def open_db(
    path: str | os.PathLike[str], backend: str | None = None, *, labels: str | os.PathLike[str]
) -> LabeledDataset: ...


def open_db(
    path: str | os.PathLike[str],
    backend: str | None = None,
    *,
    labels: str | os.PathLike[str] | None = None,
) -> DatumDataset | LabeledDataset:
    """Open a finished Caffe Datum database (LMDB or LevelDB, detected) as a read-only dataset.

    Args:
        path: the database directory (any path bytes: non-UTF-8 names work).
        backend: ``"lmdb"`` or ``"leveldb"``; detected from the directory's files when None.
        labels: its label database (``OUT_labels``, as ``imageset --values`` writes it):
            the dataset then yields ``(image, targets)``, ``targets`` a float32 vector
            (a :class:`mnist2db.reading.labeled_dataset.LabeledDataset`).

    Returns:
        A :class:`DatumDataset`: ``len(db)``, ``db[i] -> (image, label)`` with ``image`` a
        ``(channels, height, width)`` numpy array, ``db[a:b]`` a list of those, iteration,
        ``db.__getitems__(indices)``, ``db.read_range(start, stop)``.

    Raises:
        BackendError: the path is missing or not a database of either backend.
        DatumError: ``labels`` is not the label database of ``path`` (another count of
            records, other first or last keys).
    """
    if labels is None:
        return DatumDataset(path, backend)
    return LabeledDataset(DatumDataset(path, backend), DatumDataset(labels, backend))
