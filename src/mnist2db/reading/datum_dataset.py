"""Read a finished Caffe Datum database as a dataset: ``open_db(path)[i] -> (image, label)``.

The object :func:`open_db` returns is a read-only, map-style dataset: ``len()``, integer
indexing (negative too), slicing, iteration, ``__getitems__`` (PyTorch's batched fetch) and
:meth:`DatumDataset.read_range` (a contiguous range as one ``(n, c, h, w)`` array). That is
the protocol a PyTorch ``DataLoader`` asks of a map-style dataset; torch is never imported.

Each image is a fresh, writable numpy array of shape ``(channels, height, width)``: uint8
for ``data``, float64 for ``float_data`` (as pycaffe's ``datum_to_array``), and for an
encoded Datum the decoded image as Caffe's data layer sees it (grey: 1 channel; colour: 3,
in OpenCV's BGR order). Each label is an int.

Random access relies on Caffe's keys: record ``i`` is stored under ``"%08d" % i``. When a
database's keys are not that sequence, the keys are read once, on first indexed access,
and held in memory (one short bytes object per record).

Records in the layout of the first record (same shape, raw uint8 pixels, a label from 0
to 127: every MNIST record) are read without protobuf, straight from the stored bytes;
so are PNG records as ``convert --encoded png`` writes them (:mod:`mnist2db.reading.png_datums`:
checked by slices and the IDAT CRC, one zlib call each, a batch's inflated on a few
threads and unpacked by one numpy pass). Any other record goes through protobuf and the
general decoder, which gives the same image and label and names whatever is wrong.

Processes and threads: see :mod:`mnist2db.storage.databases.readers`. A pickled dataset carries no handle
and opens its own on first use (spawn, forkserver); a forked child reopens LMDB on first
use; LevelDB admits one process at a time, so a worker process reading a LevelDB database
that its parent holds fails with one :class:`~mnist2db.errors.BackendError` saying what
to do (``num_workers=0``, or convert to LMDB).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from mnist2db.errors import (
    BackendError,
    MissingKeyError,
    Mnist2dbError,
    RecordIndexError,
    backend_message,
)
from mnist2db.formats.datum.message import (
    KEY_FORMAT,
    KEY_LIMIT,
    record_key,
)
from mnist2db.reading.decoder import RecordDecoder, as_records
from mnist2db.reading.threaded import decode_stream
from mnist2db.storage.databases.backends import detect_backend
from mnist2db.storage.databases.handles import ReadHandle, handle_class
from mnist2db.storage.databases.readers import DbReader, iterate

#: Bound once: db[i]'s hot path looks them up per record.
_ndarray = np.ndarray
_uint8 = np.dtype(np.uint8)

#: Guards a dataset's reader while threads open and close it (rarely: not per read).
_READER_LOCK = threading.RLock()


def _after_fork_in_child() -> None:
    global _READER_LOCK
    _READER_LOCK = threading.RLock()  # another thread may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class DatumDataset:
    """A finished LMDB or LevelDB database of Caffe Datums, read-only, indexed like a list.

    Make one with :func:`open_db`.
    """

    # Slots: db[i] is the hot path of a training loop, and slot attributes load fastest.
    __slots__ = (
        "_errors",
        "_fast",
        "_fast_png",
        "_identity",
        "_decoder",
        "_keys",
        "_length",
        "_lookup",
        "_reader",
        "_sequential",
        "backend",
        "path",
    )

    #: Attributes that belong to one process: not pickled (a worker opens its own handle).
    _PROCESS_LOCAL = ("_reader", "_lookup", "_errors")

    def __init__(self, path: str | os.PathLike[str] | bytes, backend: str | None = None) -> None:
        self.path = os.fsdecode(path)
        self.backend = backend or detect_backend(self.path)
        self._reader: DbReader | None = None
        self._lookup: Any = None  # the handle's hot-path get (LMDB: ReadHandle.lookup)
        #: The database directory this dataset reads: used again, it must find that one.
        self._identity: tuple[int, int] | None = None
        self._keys: list[bytes] | None = None
        reader = self._open()
        self._identity = reader.identity
        # Record i is read under Caffe's key "%08d" % i only if the keys are exactly that
        # sequence; otherwise by position in key order. One pass over the keys tells (about
        # 0.5 µs a key: 30 ms for MNIST's training set) and counts them for LevelDB.
        self._length = 0
        sequential = True
        for key in reader.iter_keys():
            sequential = sequential and bytes(key) == record_key(self._length)
            self._length += 1
        self._sequential = sequential and self._length <= KEY_LIMIT
        first = reader.first_key()
        self._decoder = RecordDecoder(self.path, None if first is None else reader.get(first))
        self._init_fast()

    def _init_fast(self) -> None:
        # db[i]'s fast path: a handle with a lookup (LMDB), Caffe's keys, a first record in
        # Caffe's fixed layout.
        handles = handle_class(self.backend)
        lookup_keys = self._sequential and handles.has_lookup
        self._fast = self._decoder.layout if lookup_keys else None
        self._fast_png = self._decoder.png if lookup_keys else None
        self._errors: tuple[type[Exception], ...] = handles.errors()

    # -- the handle, shared by the process (mnist2db.storage.databases.readers) ----------------------------

    def _open(self) -> DbReader:
        with _READER_LOCK:
            reader = self._reader
            if reader is None or reader.closed:
                reader = DbReader(self.path, self.backend, identity=self._identity)
                handle = reader.handle
                self._lookup = handle.lookup if handle.has_lookup else None
                self._reader = reader
            return reader

    def _pinned(self) -> ReadHandle:
        """The handle, pinned for one read (opened again if the dataset was closed)."""
        while True:
            reader = self._reader
            handle = (reader if reader is not None else self._open()).pin()
            if handle is not None:
                return handle
            # Closed by another thread between the two steps: open it again.
            self._open()

    def close(self) -> None:
        """Release the database handle (it is reopened if the dataset is used again).

        Safe from any thread while others read: a read in progress finishes, and the next
        one opens the handle again.
        """
        with _READER_LOCK:
            reader, self._reader = self._reader, None
            self._lookup = None
        if reader is not None:
            reader.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> DatumDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            name: getattr(self, name)
            for name in self.__slots__
            if name not in self._PROCESS_LOCAL and hasattr(self, name)
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._reader = None
        self._lookup = None
        self._init_fast()

    # -- keys ----------------------------------------------------------------------------

    def _position(self, index: Any) -> int:
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(
                f"{self.path}: record indices must be integers or slices, "
                f"not {type(index).__name__}"
            )
        index = index.__index__()
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise RecordIndexError(
                f"{self.path}: index {index} is out of range ({self._length} records)"
            )
        return int(position)

    def key(self, index: int) -> bytes:
        """The key of record ``index`` (negative counts from the end)."""
        position = self._position(index)
        if self._sequential:
            return record_key(position)
        if self._keys is None:
            self._keys = [bytes(k) for k in iterate(self._pinned, None, keys_only=True)]
        return self._keys[position]

    # -- records -------------------------------------------------------------------------

    def _fetch(self, key: bytes) -> bytes:
        handle = self._pinned()
        try:
            value = handle.get(key)
        finally:
            DbReader.unpin(handle)
        if value is None:
            raise MissingKeyError(f"{self.path}: no record with key {key.decode(errors='replace')}")
        return value

    def _failed(self, exc: Exception, text: str) -> Mnist2dbError:
        return BackendError(f"{self.path}: {self.backend} read failed: {text}")

    def value(self, key: bytes) -> bytes:
        """The stored bytes under ``key`` (a label database's records, read by
        :class:`mnist2db.reading.labeled_dataset.LabeledDataset`).

        Raises:
            MissingKeyError: no record has that key.
        """
        return self._fetch(key)

    def get(self, key: bytes | str) -> tuple[np.ndarray, int]:
        """The record stored under ``key``.

        Raises:
            MissingKeyError: no record has that key.
        """
        raw_key = key.encode() if isinstance(key, str) else bytes(key)
        return self._decoder.decode(raw_key, self._fetch(raw_key))

    @overload
    def __getitem__(self, index: int) -> tuple[np.ndarray, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[np.ndarray, int]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[np.ndarray, int] | list[tuple[np.ndarray, int]]:
        # The hot path of a training loop, kept flat: an int index, Caffe's keys, LMDB, a
        # record in the first record's layout. Everything else, and every error (no
        # transaction in this thread yet, an index out of range, so no such key: get returns
        # None), takes the general path below.
        fast = self._fast
        if fast is not None and index.__class__ is int:
            key = KEY_FORMAT % (index + self._length if index < 0 else index)  # record_key, inlined
            try:
                value = self._lookup(key)
                if (
                    len(value) == fast[0]
                    and value[-2] == 0x28
                    and value[-1] < 0x80
                    and value.startswith(fast[1])
                ):
                    return _ndarray(fast[2], _uint8, bytearray(value), fast[3]), value[-1]
            except (AttributeError, TypeError):
                pass
            except self._errors as exc:
                raise self._failed(exc, backend_message(exc)) from exc
        # The same for PNG records as mnist2db writes them (formats.png_records): None from
        # read() for any record not exactly in that layout.
        png = self._fast_png
        if png is not None and index.__class__ is int:
            key = KEY_FORMAT % (index + self._length if index < 0 else index)
            try:
                record = png.read(self._lookup(key))
                if record is not None:
                    return record
            except (AttributeError, TypeError):
                pass
            except self._errors as exc:
                raise self._failed(exc, backend_message(exc)) from exc
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        key = self.key(index)
        return self._decoder.decode(key, self._fetch(key))

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[np.ndarray, int]]:
        """The records at ``indices``, as ``[db[i] for i in indices]`` gives them (PyTorch's
        batched fetch: ``DataLoader`` calls it with each batch's indices when a dataset has
        it). ``indices`` is any sequence of integers: a list, a tuple, a numpy array, numpy
        integers. When the records stack (one shape, one dtype) their images are views of
        one ``(n, c, h, w)`` array made for the batch; otherwise each is its own array.

        Raises:
            RecordIndexError: an index is out of range.
            TypeError: an index is not an integer.
        """
        if isinstance(indices, np.ndarray):
            indices = indices.tolist()  # numpy's integers as Python's (bools stay refused)
        if not all(i.__class__ is int for i in indices):
            indices = [self._position(i) for i in indices]
        if not indices:
            return []
        if self._fast is not None or self._fast_png is not None:
            length = self._length
            if -length <= min(indices) and max(indices) < length:
                keys = [KEY_FORMAT % (i + length if i < 0 else i) for i in indices]
                try:
                    try:
                        found: list[Any] = list(map(self._lookup, keys))
                    except (AttributeError, TypeError):  # no transaction here yet, or closed
                        self._fetch(keys[0])
                        try:
                            found = list(map(self._lookup, keys))
                        except (AttributeError, TypeError):  # closed again meanwhile
                            found = [None]  # the general path below
                except self._errors as exc:
                    raise self._failed(exc, backend_message(exc)) from exc
                if None not in found:
                    return as_records(self._decoder.batch(keys, found))
        keys = [self.key(i) for i in indices]
        values = [self._fetch(key) for key in keys]
        return as_records(self._decoder.batch(keys, values))

    def read_range(self, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Records ``start`` to ``stop`` (exclusive) as one ``(n, c, h, w)`` image array and
        one ``(n,)`` int64 label array, read sequentially (one cursor). The bounds are
        those of a slice, ``db[start:stop]``: negative ones count from the end.

        Raises:
            DatumError: the records do not all have one shape and dtype.
        """
        start, stop, _ = slice(start, stop).indices(self._length)
        keys: list[bytes] = []
        values: list[bytes] = []
        if start < stop:
            for key, value in iterate(self._pinned, self.key(start), keys_only=False):
                if len(keys) == stop - start:
                    break
                keys.append(bytes(key))
                values.append(bytes(value))
        return self._decoder.stack(keys, values)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        for _, _, image, label in self.records():
            yield image, label

    def records(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, bytes, np.ndarray, int]]:
        """Stream ``(index, key, image, label)`` for records ``start`` to ``stop`` (exclusive),
        in key order, reading sequentially (one cursor, no lookups). Negative bounds count
        from the end, as in a slice."""
        start, stop, _ = slice(start, stop).indices(self._length)
        if start >= stop:
            return

        first_key = self.key(start)
        # A few records at a time, so that encoded ones decode on a few threads.
        records = iterate(self._pinned, first_key, keys_only=False)
        stream = decode_stream(self._decoder.decode_batch, records, stop - start)
        for index, (key, (image, label)) in enumerate(stream, start):
            yield index, key, image, label

    def __repr__(self) -> str:
        return f"<DatumDataset {self.path!r} ({self.backend}, {self._length} records)>"
