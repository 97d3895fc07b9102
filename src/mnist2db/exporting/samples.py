"""One database record as the file an export writes: its bytes, its extension, its name.

* An encoded record (``Datum.encoded``: what ``convert_imageset --encoded`` and
  ``convert --encoded png`` store) is written as its stored bytes, never decoded nor
  re-encoded; the extension comes from the bytes' signature (:data:`EXTENSIONS`).
* A raw record becomes a lossless PNG: 1 channel grey, 3 channels colour, Caffe's BGR
  stored as the PNG's RGB, so ``cv::imread`` (BGR) and Pillow (RGB) give back the record's
  pixels. Other channel counts and ``float_data`` records are not images: refused in one line.

Names: a key ``convert_imageset`` wrote (``%08d_PATH``) gives back ``PATH`` when it is a
safe relative path (:func:`caffe_path`); any other key is used as a file name when it is a
plain one, else mapped to a safe name that keeps a readable part and a digest of the key
(:func:`file_stem`, :func:`sample_key`: a WebDataset sample key has no dot).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from queue import Full, Queue
from typing import Any, NamedTuple, TypeVar

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.exporting.png_worker import IN_FLIGHT, PngWorker, worth_a_worker
from mnist2db.exporting.raw_records import (
    FixedLayout,
    FixedRaws,
    RawRecord,
    raw_fields,
)
from mnist2db.formats.datum import check_datum, decode_datum, key_text
from mnist2db.formats.datum_fields import encoded_fields
from mnist2db.formats.image_encode import encode_png as encode_colour_png
from mnist2db.formats.image_input import image_format
from mnist2db.formats.png import encode_grey_pngs

T = TypeVar("T")

#: The extension written for each format :func:`mnist2db.formats.image.image_format` names.
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "BMP": "bmp", "TIFF": "tif", "WEBP": "webp"}
#: PNM's magic digit -> extension (PBM, PGM, PPM).
_PNM = {"1": "pbm", "4": "pbm", "2": "pgm", "5": "pgm", "3": "ppm", "6": "ppm"}
#: The extension of encoded bytes of no format OpenCV reads (kept as they are).
UNKNOWN_EXTENSION = "bin"
#: Records decoded and encoded together, and the bytes a batch may hold (memory's bound).
BATCH_RECORDS = 1000
BATCH_BYTES = 8 << 20
#: The longest restored path (bytes) and path component; longer ones are mapped.
PATH_LIMIT = 1024
NAME_LIMIT = 200

_CAFFE_KEY = re.compile(rb"[0-9]{8,}_(.+)", re.DOTALL)
_PLAIN_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.+=,@-]{0,127}")
_PLAIN_SAMPLE = re.compile(r"[A-Za-z0-9_-]{1,90}")
#: Plain sample keys, one a line (:func:`plain_sample_keys`).
_PLAIN_SAMPLES = re.compile(rb"[A-Za-z0-9_-]{1,90}(?:\n[A-Za-z0-9_-]{1,90})*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class Sample(NamedTuple):
    """A record as a file: ``key`` (the database's), ``label``, ``data`` (the file's bytes),
    ``ext`` (its extension, without the dot), ``encoded`` (the stored bytes as they are;
    False: a PNG of raw pixels)."""

    key: bytes
    label: int
    data: bytes | memoryview
    ext: str
    encoded: bool


def extension(data: bytes | memoryview) -> str:
    """The extension of encoded image bytes, from their signature (``bin`` when unknown)."""
    kind = image_format(bytes(data[:12]))
    if kind == "PPM":
        return _PNM.get(chr(data[1]), "ppm")
    return EXTENSIONS.get(kind or "", UNKNOWN_EXTENSION)


def read_record(db_path: str, key: bytes, value: bytes) -> Any:
    """The Datum of one record, parsed and checked; a bad one refused naming the key.

    Raises:
        DatumError: ``db_path: key KEY: what is wrong``.
    """
    where = f"{db_path}: key {key_text(key)}"
    try:
        datum = decode_datum(value)
        check_datum(datum, where)
    except DatumError as exc:
        text = str(exc)
        raise DatumError(text if text.startswith(where) else f"{where}: {text}") from None
    return datum


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


class SampleBatch(NamedTuple):
    """Consecutive samples, as columns: ``keys``, ``labels``, ``data`` (the files' bytes),
    ``exts``; ``encoded``: all stored bytes as they are, or all PNGs of raw pixels."""

    keys: list[bytes]
    labels: list[int]
    data: list[bytes | memoryview]
    exts: list[str]
    encoded: bool

    def samples(self) -> Iterator[Sample]:
        for key, label, data, ext in zip(self.keys, self.labels, self.data, self.exts,
                                         strict=True):  # fmt: skip
            yield Sample(key, label, data, ext, self.encoded)


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
    :meth:`~mnist2db.storage.readers.DbReader.iter_views`), in the same order, in batches of
    at most :data:`BATCH_RECORDS` records and about :data:`BATCH_BYTES` bytes (memory's
    bound): encoded records pass on their stored bytes, found without protobuf
    (:func:`~mnist2db.formats.datum_fields.encoded_fields`) and copied once; raw ones,
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
    one (:class:`~mnist2db.exporting.raw_records.FixedLayout`, learnt from it) a batch at a
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


def prefetched(items: Iterator[T], ahead: int = BATCHES_AHEAD) -> Iterator[T]:
    """``items``, made on a thread of their own at most ``ahead`` items before they are
    taken: the decoding and encoding of the next batches go on while the caller writes
    (its file creations, writes and flushes release the GIL). An exception of ``items``
    is raised here, in order; closing this iterator (a failure, an interruption) stops the
    thread and closes ``items`` in it."""
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
    try:
        while True:
            made, item = queue.get()
            if not made:
                raise item
            if item is end:
                return
            yield item
    finally:
        stop.set()
        thread.join()


# -- names ---------------------------------------------------------------------------------


def caffe_path(key: bytes, reserved: Iterable[str] = ()) -> str | None:
    """The relative path a ``convert_imageset`` key (``%08d_PATH``) names, when safe to
    restore under the output: UTF-8, printable, relative, no empty, ``.`` or ``..`` part,
    at most :data:`PATH_LIMIT` bytes and :data:`NAME_LIMIT` a part, not beginning with one
    of ``reserved`` (the export's own files). None otherwise (or not such a key)."""
    match = _CAFFE_KEY.fullmatch(key)
    if match is None:
        return None
    raw = match.group(1)
    if len(raw) > PATH_LIMIT:
        return None
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not path.isprintable() or path.startswith("/"):
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") or len(p.encode()) > NAME_LIMIT for p in parts):
        return None
    if parts[0] in reserved:
        return None
    return path


def _mapped(text: str, key: bytes) -> str:
    readable = _UNSAFE.sub("_", text)[:64].strip("_") or "key"
    return f"{readable}_{hashlib.sha256(key).hexdigest()[:12]}"


def file_stem(key: bytes) -> tuple[str, bool]:
    """A file name (without extension) for ``key``: the key itself when a plain name
    (ASCII letters, digits, ``_-.+=,@``, not beginning with a dot, ≤ 128 characters), else a
    mapped one; and whether it was mapped."""
    text = key.decode("ascii", errors="replace")
    if _PLAIN_FILE.fullmatch(text):
        return text, False
    return _mapped(text, key), True


def sample_key(key: bytes) -> tuple[str, bool]:
    """A WebDataset sample key for ``key`` (no dot, no ``/``: a loader cuts a member's name
    at its first dot): the key itself when plain (ASCII letters, digits, ``_-``, ≤ 90),
    else a mapped one; and whether it was mapped."""
    text = key.decode("ascii", errors="replace")
    if _PLAIN_SAMPLE.fullmatch(text):
        return text, False
    return _mapped(text, key), True


def plain_sample_keys(keys: list[bytes]) -> bool:
    """True when every key is a plain sample key (:func:`sample_key` keeps it as it is),
    checked in one match of them all."""
    return _PLAIN_SAMPLES.fullmatch(b"\n".join(keys)) is not None


def key_fields(key: bytes) -> dict[str, str]:
    """The source key as JSON holds it: ``{"key": text}``, or ``{"key_hex": ...}`` when it
    is not UTF-8."""
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {"key_hex": key.hex()}


#: The largest class-name file read (one name a line).
CLASSES_LIMIT = 1 << 20


def read_class_names(path: str) -> tuple[str, ...]:
    """The class names of a ``classes.txt`` (one a line, in label order: what ``imageset``
    writes beside a database made from class folders, ``DB.classes.txt``).

    Raises:
        DatumError: the file cannot be read, is larger than :data:`CLASSES_LIMIT`, or is not UTF-8.
    """
    try:
        with open(path, "rb") as stream:
            data = stream.read(CLASSES_LIMIT + 1)
    except OSError as exc:
        raise DatumError(f"{path}: cannot read the class names: {exc.strerror}") from None
    if len(data) > CLASSES_LIMIT:
        raise DatumError(f"{path}: more than {CLASSES_LIMIT} bytes: not a list of class names")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DatumError(f"{path}: class names are not UTF-8 text") from None
    return tuple(text.splitlines())


def class_names(
    db_path: str, classes: str | os.PathLike[str] | None
) -> tuple[tuple[str, ...], str | None]:
    """The class names of ``db_path``'s labels and the file they come from: ``classes``, else
    the ``DB.classes.txt`` beside the database (``imageset``'s), else none."""
    path = os.fsdecode(classes) if classes is not None else None
    beside = os.path.normpath(db_path) + ".classes.txt"
    if path is None and os.path.isfile(beside):
        path = beside
    return (read_class_names(path) if path is not None else ()), path
