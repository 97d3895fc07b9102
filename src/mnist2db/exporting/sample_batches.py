"""A database's records as samples, a batch at a time, in key order
(:func:`iter_batches`): encoded records as their stored bytes, raw ones as PNGs, encoded
together (here, or beside in a :class:`~mnist2db.exporting.png_worker.PngWorker`), and made
ahead of their writer on a thread (:func:`prefetched`). What a sample is and how it is
named: :mod:`mnist2db.exporting.samples`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from queue import Full, Queue
from typing import Any, TypeVar

import numpy as np

from mnist2db.exporting.fixed_layout import FixedLayout, FixedRaws, RawRecord, raw_fields
from mnist2db.exporting.png_worker import IN_FLIGHT, PngWorker, worth_a_worker
from mnist2db.exporting.samples import Sample, SampleBatch, extension, read_record
from mnist2db.formats.datum.fields import encoded_fields
from mnist2db.formats.datum.message import key_text
from mnist2db.formats.imread.imencode import encode_png as encode_colour_png
from mnist2db.formats.png.encoder import encode_grey_pngs

T = TypeVar("T")

#: Records decoded and encoded together, and the bytes a batch may hold (memory's bound).
BATCH_RECORDS = 1000
BATCH_BYTES = 8 << 20


def _raw_batch(
    batch: list[RawRecord] | FixedRaws,
    encode_grey: Callable[[np.ndarray], list[bytes]] | None = None,
) -> SampleBatch:
    """The PNGs of raw records, in order: grey records of one shape encoded together (by
    ``encode_grey``: here, or in a :class:`~mnist2db.exporting.png_worker.PngWorker`)."""
    encode_grey = encode_grey or encode_grey_pngs
    if isinstance(batch, FixedRaws):
        n, channels, height, width = batch.images.shape
        made: list[bytes | memoryview]
        if channels == 1:
            made = list(encode_grey(batch.images.reshape(n, height, width)))
        else:
            made = [encode_colour_png(planes.transpose(1, 2, 0)) for planes in batch.images]
        return SampleBatch(batch.keys, batch.labels, made, ["png"] * n, False)
    made = [b""] * len(batch)
    grey: dict[tuple[int, int], list[int]] = {}
    for i, (_, _, (channels, height, width), data) in enumerate(batch):
        if channels == 1:
            grey.setdefault((height, width), []).append(i)
        else:
            planes = np.frombuffer(data, dtype=np.uint8).reshape(channels, height, width)
            made[i] = encode_colour_png(planes.transpose(1, 2, 0))
    for (rows, cols), where in grey.items():
        joined = b"".join([batch[i][3] for i in where])
        images = np.frombuffer(joined, dtype=np.uint8).reshape(len(where), rows, cols)
        for i, data in zip(where, encode_grey(images), strict=True):
            made[i] = data
    keys = [raw[0] for raw in batch]
    labels = [raw[1] for raw in batch]
    return SampleBatch(keys, labels, made, ["png"] * len(batch), False)


def iter_samples(db_path: str, records: Iterable[tuple[bytes, bytes]]) -> Iterator[Sample]:
    """The samples of ``records`` (``(key, value)`` in key order), in the same order
    (:func:`iter_batches`, made ahead on a thread: :func:`prefetched`, one by one).

    Raises:
        DatumError: a value is not a Datum, or a raw one is not an image a file can hold.
    """
    for batch in prefetched(iter_batches(db_path, records)):
        yield from batch.samples()


def start_png_worker(first: bytes | None) -> PngWorker | None:
    """A process to encode raw grey records' PNGs beside this one (:mod:`~mnist2db.exporting.png_worker`)
    when ``first``, a database's first value, is such a record and there are two CPUs; else None."""
    layout = FixedLayout.of(first) if first is not None else None
    if layout is None or layout.shape[0] != 1 or not worth_a_worker():
        return None
    return PngWorker(encode_grey_pngs)


def iter_batches(
    db_path: str, records: Iterable[tuple[bytes, Any]], worker: PngWorker | None = None
) -> Iterator[SampleBatch]:
    """The samples of ``records`` (``(key, value)`` in key order, a value bytes or a buffer:
    :meth:`~mnist2db.storage.databases.readers.DbReader.iter_views`), in the same order, in batches of
    at most :data:`BATCH_RECORDS` records and about :data:`BATCH_BYTES` bytes (memory's
    bound): encoded records pass on their stored bytes, found without protobuf
    (:func:`~mnist2db.formats.datum.fields.encoded_fields`) and copied once; raw ones,
    gathered, are encoded together, by ``worker`` while it is free (at most
    :data:`~mnist2db.exporting.png_worker.IN_FLIGHT` batches), else here.

    Raises:
        DatumError: a value is not a Datum, or a raw one is not an image a file can hold.
    """
    ahead: deque[SampleBatch | Future[SampleBatch]] = deque()
    for item in _batches(db_path, records):
        if isinstance(item, SampleBatch):
            ahead.append(item)
        elif worker is not None and worker.free():
            ahead.append(worker.submit(_raw_batch, item))
        else:
            ahead.append(_raw_batch(item))
        while ahead and (len(ahead) > IN_FLIGHT or not isinstance(ahead[0], Future)):
            yield _made(ahead.popleft())
    while ahead:
        yield _made(ahead.popleft())


def _made(item: SampleBatch | Future[SampleBatch]) -> SampleBatch:
    return item.result() if isinstance(item, Future) else item


def _batches(
    db_path: str, records: Iterable[tuple[bytes, Any]]
) -> Iterator[SampleBatch | list[RawRecord] | FixedRaws]:
    """:func:`iter_batches`' batches, a raw one as its records (to be encoded)."""
    gathered = _Gathered(db_path)
    keys, values = gathered.fixed_keys, gathered.fixed_values
    length, limit = gathered.length, gathered.fixed_limit
    for key, value in records:
        if len(value) == length:  # no generator a record: the common case inline
            keys.append(bytes(key))
            values.append(value)
            if len(keys) >= limit:
                yield from gathered.fixed()
        else:
            yield from gathered.fixed()
            yield from gathered.one(bytes(key), value)
            length, limit = gathered.length, gathered.fixed_limit  # learnt from a first one
    yield from gathered.end()


class _Gathered:
    """The batches :func:`_batches` gathers: records in the fixed layout of the first raw
    one (:class:`~mnist2db.exporting.fixed_layout.FixedLayout`, learnt from it) a batch at a
    time, by numpy; any other record (and a batch of that length not all in the layout) one
    by one (:meth:`one`). Batches are yielded in the records' order."""

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.raws: list[RawRecord] = []
        self.encoded = SampleBatch([], [], [], [], True)
        self.size = 0
        self.layout: FixedLayout | None = None
        #: The records gathered in the layout (of ``length`` bytes, ``fixed_limit`` a batch).
        self.fixed_keys: list[bytes] = []
        self.fixed_values: list[Any] = []
        self.length = -1
        self.fixed_limit = BATCH_RECORDS

    def end(self) -> Iterator[SampleBatch | list[RawRecord] | FixedRaws]:
        yield from self.fixed()
        yield from self._flush()

    def fixed(self) -> Iterator[SampleBatch | list[RawRecord] | FixedRaws]:
        """The records gathered in the layout, as one batch (after every batch before)."""
        if not self.fixed_keys or self.layout is None:
            return
        keys, values = self.fixed_keys[:], self.fixed_values[:]
        self.fixed_keys.clear()  # in place: _batches holds them
        self.fixed_values.clear()
        run = self.layout.read(keys, values)
        if run is None:  # not all in the layout: read one by one, as any record
            for key, value in zip(keys, values, strict=True):
                yield from self.one(key, value)
            return
        yield from self._flush()
        yield run

    def _learnt(self, layout: FixedLayout) -> None:
        self.layout, self.length = layout, layout.length
        if layout.size:
            self.fixed_limit = max(1, min(BATCH_RECORDS, BATCH_BYTES // layout.length))

    def _flush(self) -> Iterator[SampleBatch | list[RawRecord]]:
        if self.raws:
            yield self.raws
            self.raws = []
        if self.encoded.keys:
            yield self.encoded
            self.encoded = SampleBatch([], [], [], [], True)
        self.size = 0

    def one(self, key: bytes, value: Any) -> Iterator[SampleBatch | list[RawRecord]]:
        """One record, through protobuf where its stored bytes are not found without (the
        first raw one: in the fixed layout, learnt without protobuf, gathered as such)."""
        datum: Any = None
        found = encoded_fields(value)
        if found is None and self.layout is None:
            layout = FixedLayout.of(value)
            if layout is not None and layout.shape[0] in (1, 3):
                self._learnt(layout)
                self.fixed_keys.append(key)
                self.fixed_values.append(value)
                return
        if found is not None:  # the stored bytes, without protobuf
            label = found[2]
            data: bytes | memoryview = memoryview(value)[found[0] : found[1]]
            if isinstance(value, memoryview):
                # Copied once out of LMDB's map: writing and hashing from the map (4 KiB
                # pages, two passes, each a TLB miss a page on this virtual machine) was
                # measured slower than from the heap (2 GB: 5.1-5.3 s against 5.8-6.9 s).
                data = bytes(data)
        else:
            value = bytes(value)
            datum = read_record(self.db_path, key, value)
            label, data = int(datum.label), datum.data
        if datum is None or datum.encoded:
            if self.raws:
                yield from self._flush()
            encoded = self.encoded
            encoded.keys.append(key)
            encoded.labels.append(label)
            encoded.data.append(data)
            encoded.exts.append(extension(data))
            del datum, value  # the record's one copy (if any) is the sample's
            self.size += len(data)
            if len(encoded.keys) >= BATCH_RECORDS or self.size >= BATCH_BYTES:
                yield from self._flush()
            return
        raw = raw_fields(datum, key, f"{self.db_path}: key {key_text(key)}")
        if self.layout is None:
            # Not in the fixed layout (FixedLayout.of: None): none is, from here on.
            self._learnt(FixedLayout(-1, b"", (0, 0, 0)))
        if self.encoded.keys:
            yield from self._flush()
        self.raws.append(raw)
        self.size += len(raw[3])
        if len(self.raws) >= BATCH_RECORDS or self.size >= BATCH_BYTES:
            yield from self._flush()


#: Batches made ahead of their writer by :func:`prefetched` (memory's bound: with the one
#: being made and the one being written, three batches).
BATCHES_AHEAD = 1
_POLL = 0.1


def prefetched(
    items: Iterator[T], ahead: int = BATCHES_AHEAD, abort: Callable[[], None] | None = None
) -> Iterator[T]:
    """``items``, made on a thread of their own at most ``ahead`` items before they are
    taken: the decoding and encoding of the next batches go on while the caller writes
    (its file creations, writes and flushes release the GIL). An exception of ``items``
    is raised here, in order; closing this iterator (a failure, an interruption) stops the
    thread and closes ``items`` in it, after calling ``abort`` (what ends a process the
    thread may be waiting for: an interruption never waits for one that is stopped)."""
    queue: Queue[tuple[bool, Any]] = Queue(ahead)
    stop = threading.Event()
    end = object()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                queue.put(entry, timeout=_POLL)
                return True
            except Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, end))
        except BaseException as exc:  # handed to the caller's thread, raised there
            put((False, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="mnist2db-export", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            made, item = queue.get()
            if not made:
                raise item
            if item is end:
                finished = True
                return
            yield item
    finally:
        stop.set()
        if not finished and abort is not None:
            abort()
        thread.join()
