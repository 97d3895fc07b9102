"""Read a finished Caffe Datum database as a dataset: ``open_db(path)[i] -> (image, label)``.

The object :func:`open_db` returns is a read-only, map-style dataset: ``len()``, integer
indexing (negative too), slicing and iteration. That is the whole protocol a PyTorch
``DataLoader`` asks of a map-style dataset, so it can be passed to one directly; torch
is never imported here::

    from torch.utils.data import DataLoader
    loader = DataLoader(mnist2db.open_db("examples/mnist/mnist_train_lmdb"), batch_size=64,
                        shuffle=True, num_workers=2)

Each image is a fresh, writable numpy array of shape ``(channels, height, width)`` (uint8
for databases written by Caffe's ``convert_mnist_data`` or by mnist2db), each label an int.

Random access relies on Caffe's keys: record ``i`` is stored under ``"%08d" % i``. When a
database's keys are not that sequence, the keys are read once, on first indexed access,
and held in memory (one short bytes object per record).

Worker processes: the database handle is dropped when the object is pickled and opened
again on first use, so the dataset can be sent to spawned workers; forked workers read
through the handle they inherit. LMDB admits any number of reading processes. LevelDB
admits one process at a time: with a LevelDB database use ``num_workers=0`` or the fork
start method, or convert it to LMDB. One process may open a database any number of times:
the datasets share one handle.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, overload

from .backends import DbReader, detect_backend, open_reader
from .datum import datum_to_array, decode_datum
from .errors import Mnist2dbError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DatumDataset",
    "MissingKeyError",
    "RecordIndexError",
    "open_db",
    "record_key",
    "shared_reader",
]

#: One reader per database per process, shared by every dataset open on it: neither LMDB
#: nor LevelDB lets a process open the same database twice.
#: (real path, backend) -> [reader, number of datasets using it, pid of the opener]
#: A child made by fork() inherits this table and reads through its parent's handles
#: (py-lmdb refuses a second environment on the same files), but never closes them:
#: closing an LMDB environment in the child would clear the parent's reader slots.
_SHARED: dict[tuple[str, str], list[Any]] = {}


def _acquire(path: str, backend: str) -> DbReader:
    key = (os.path.realpath(path), backend)
    entry = _SHARED.get(key)
    if entry is None:
        entry = _SHARED[key] = [open_reader(path, backend), 0, os.getpid()]
    entry[1] += 1
    reader: DbReader = entry[0]
    return reader


def _release(path: str, backend: str, reader: DbReader) -> None:
    key = (os.path.realpath(path), backend)
    entry = _SHARED.get(key)
    if entry is None or entry[0] is not reader:
        return
    entry[1] -= 1
    if entry[1] <= 0 and entry[2] == os.getpid():
        del _SHARED[key]
        reader.close()


@contextlib.contextmanager
def shared_reader(path: str | os.PathLike[str], backend: str | None = None) -> Iterator[DbReader]:
    """The process's reader of the database at ``path``, shared with any open dataset on it.

    For code that reads a database once (info, verify, export): opening it with
    :func:`~mnist2db.backends.open_reader` would fail while a dataset holds it open.
    """
    path = os.fspath(path)
    backend = backend or detect_backend(path)
    reader = _acquire(path, backend)
    try:
        yield reader
    finally:
        _release(path, backend, reader)


# Caffe's "%08d" keys sort in index order only below 10**8 records.
_SEQUENTIAL_LIMIT = 10**8


class RecordIndexError(Mnist2dbError, IndexError):
    """An index outside ``range(len(db))``; also an IndexError, as sequences raise."""


class MissingKeyError(Mnist2dbError, KeyError):
    """No record is stored under a key; also a KeyError, as mappings raise."""

    def __str__(self) -> str:
        # KeyError quotes its argument; the message is a sentence, keep it as written.
        return str(self.args[0]) if self.args else ""


def record_key(index: int) -> bytes:
    """Caffe's key for record ``index``: ``b"%08d" % index``."""
    return b"%08d" % index


class DatumDataset:
    """A finished LMDB or LevelDB database of Caffe Datums, read-only, indexed like a list.

    Make one with :func:`open_db`.
    """

    def __init__(self, path: str | os.PathLike[str], backend: str | None = None) -> None:
        self.path = os.fspath(path)
        self.backend = backend or detect_backend(self.path)
        self._reader: DbReader | None = None
        self._keys: list[bytes] | None = None
        reader = self._open()
        # Record i is read under Caffe's key "%08d" % i only if the keys are exactly that
        # sequence; otherwise by position in key order. One pass over the keys tells (about
        # 0.5 µs a key: 30 ms for MNIST's training set) and counts them for LevelDB.
        self._length = 0
        sequential = True
        for key in reader.iter_keys():
            sequential = sequential and bytes(key) == record_key(self._length)
            self._length += 1
        self._sequential = sequential and self._length <= _SEQUENTIAL_LIMIT

    # -- the handle, one per process -----------------------------------------------------

    def _open(self) -> DbReader:
        if self._reader is None:
            self._reader = _acquire(self.path, self.backend)
        return self._reader

    def close(self) -> None:
        """Release the database handle (it is reopened if the dataset is used again)."""
        if self._reader is not None:
            _release(self.path, self.backend, self._reader)
        self._reader = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> DatumDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- keys ----------------------------------------------------------------------------

    def _index(self, index: int) -> int:
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise RecordIndexError(
                f"{self.path}: index {index} is out of range ({self._length} records)"
            )
        return position

    def key(self, index: int) -> bytes:
        """The key of record ``index`` (negative counts from the end)."""
        position = self._index(index)
        if self._sequential:
            return record_key(position)
        if self._keys is None:
            self._keys = [bytes(k) for k, _ in self._open()]
        return self._keys[position]

    # -- records -------------------------------------------------------------------------

    def _decode(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        try:
            datum = decode_datum(value)
            image = datum_to_array(datum)
        except Mnist2dbError as exc:
            raise type(exc)(f"{self.path}: key {key.decode(errors='replace')}: {exc}") from None
        if not image.flags.writeable:
            image = image.copy()
        return image, int(datum.label)

    def get(self, key: bytes | str) -> tuple[np.ndarray, int]:
        """The record stored under ``key``.

        Raises:
            MissingKeyError: no record has that key.
        """
        raw_key = key.encode() if isinstance(key, str) else bytes(key)
        value = self._open().get(raw_key)
        if value is None:
            raise MissingKeyError(
                f"{self.path}: no record with key {raw_key.decode(errors='replace')}"
            )
        return self._decode(raw_key, value)

    @overload
    def __getitem__(self, index: int) -> tuple[np.ndarray, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[np.ndarray, int]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[np.ndarray, int] | list[tuple[np.ndarray, int]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if not isinstance(index, int):
            # numpy and torch integers pass through operator.index.
            index = index.__index__()
        return self.get(self.key(index))

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        for _, _, image, label in self.records():
            yield image, label

    def records(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, bytes, np.ndarray, int]]:
        """Stream ``(index, key, image, label)`` for records ``start`` to ``stop`` (exclusive),
        in key order, reading sequentially (one cursor, no lookups)."""
        stop = self._length if stop is None else min(stop, self._length)
        if start >= stop:
            return
        first_key = self.key(start)
        index = start
        for key, value in self._open().iter_from(first_key):
            if index >= stop:
                break
            key = bytes(key)
            image, label = self._decode(key, bytes(value))
            yield index, key, image, label
            index += 1

    def __repr__(self) -> str:
        return f"<DatumDataset {self.path!r} ({self.backend}, {self._length} records)>"


def open_db(path: str | os.PathLike[str], backend: str | None = None) -> DatumDataset:
    """Open a finished Caffe Datum database (LMDB or LevelDB, detected) as a read-only dataset.

    Args:
        path: the database directory.
        backend: ``"lmdb"`` or ``"leveldb"``; detected from the directory's files when None.

    Returns:
        A :class:`DatumDataset`: ``len(db)``, ``db[i] -> (image, label)`` with ``image`` a
        ``(channels, height, width)`` numpy array, ``db[a:b]`` a list of those, iteration.

    Raises:
        BackendError: the path is missing or not a database of either backend.
    """
    return DatumDataset(path, backend)
