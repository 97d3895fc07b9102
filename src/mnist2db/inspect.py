"""Look inside IDX files and Datum databases: select records to show, describe files
(``info``), compare a database with its sources (``verify``), and write IDX files back
(``export``). Everything streams a batch at a time; memory does not grow with the data.
"""

from __future__ import annotations

import gzip
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .backends import detect_backend
from .conversion import check_pair
from .dataset import RecordIndexError, open_db, record_key, shared_reader
from .datum import DatumError, datum_to_array, decode_datum, encode_batch
from .errors import IdxFormatError, Mnist2dbError
from .idx import IdxHeader, corrupt_stream, open_data, open_idx, open_raw, parse_header, size_error

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DbInfo",
    "IdxInfo",
    "Record",
    "VerifyError",
    "db_info",
    "find_labels",
    "idx_info",
    "select_records",
    "verify_db",
]

ProgressCallback = Callable[[int, int], None]

_BATCH = 1000
_CHUNK = 1 << 20


class VerifyError(Mnist2dbError):
    """A database differs from the IDX files it is compared with."""


@dataclass(frozen=True)
class Record:
    """One item to show: its position, its key (databases only), label and image."""

    index: int
    key: bytes | None
    label: int | None
    image: np.ndarray  # (channels, height, width)


def _key_text(key: bytes) -> str:
    return key.decode("ascii", errors="backslashreplace")


# -- selecting records to show ---------------------------------------------------------------


def find_labels(images: str | os.PathLike[str]) -> str | None:
    """The label file beside an image file, found by name (``*-images-idx3-ubyte[.gz]`` ->
    ``*-labels-idx1-ubyte[.gz]``, gzip or not), or None."""
    directory, name = os.path.split(os.fspath(images))
    if "images" not in name:
        return None
    stem = name.removesuffix(".gz")
    stem = stem.replace("images", "labels").replace("idx3", "idx1")
    for candidate in (stem, stem + ".gz"):
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
) -> tuple[int, Iterator[Record]]:
    """The records ``offset`` to ``offset + count`` of an IDX image file or a database.

    Checks happen before this returns; the records are then read as the iterator runs.

    Args:
        source: an IDX image file (uint8, count × rows × cols) or a database directory.
        labels: the IDX label file for an image file; None looks for it beside ``source``
            (see :func:`find_labels`) and shows no labels when there is none.
        offset: the first record, from 0.
        count: at most this many records; fewer when the source ends first.

    Returns:
        ``(total, records)``: the number of records in the source, and the selected ones.

    Raises:
        IdxFormatError: the IDX file is not uint8 images, or the pair does not match.
        BackendError: a directory that is not a database.
        RecordIndexError: ``offset`` is past the end.
    """
    if offset < 0 or count < 0:
        raise ValueError("offset and count must not be negative")
    path = os.fspath(source)
    if os.path.isdir(path):
        db = open_db(path)
        total = len(db)
        if offset >= total:
            db.close()
            raise RecordIndexError(f"{path}: offset {offset} is past the end ({total} records)")

        def db_records() -> Iterator[Record]:
            with db:
                for index, key, image, label in db.records(offset, offset + count):
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
            check_pair(header, labels_reader.header)
        if offset >= total:
            raise RecordIndexError(f"{path}: offset {offset} is past the end ({total} images)")
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
                    label = int(label_batch[i - start]) if label_batch is not None else None
                    yield Record(i, None, label, batch[i - start][None].copy())
                start = end
                if start >= stop:
                    break
        finally:
            images_reader.close()
            if labels_reader is not None:
                labels_reader.close()

    return total, idx_records()


# -- info --------------------------------------------------------------------------------------


@dataclass
class IdxInfo:
    """What ``info`` reports on an IDX file."""

    header: IdxHeader
    file_size: int
    data_size: int  # bytes of data found after the header (decompressed for gzip)
    problem: str | None
    label_counts: dict[int, int] | None = None
    at_least: bool = False  # reading stopped one chunk past the declared size
    streaming: bool = False  # a pipe: no size known beforehand

    @property
    def expected_size(self) -> int:
        return self.header.header_size + self.header.payload_size

    @property
    def actual_size(self) -> int:
        return self.header.header_size + self.data_size

    @property
    def storage(self) -> str:
        """How the file is stored, as ``info`` shows it."""
        packing = self.header.packing
        if self.streaming:
            return f"{packing}, read from a pipe"
        return f"{packing}, {self.file_size} bytes{'' if packing == 'plain' else ' compressed'}"

    @property
    def kind(self) -> str:
        if self.header.magic == 0x00000803:
            return "MNIST images"
        if self.header.magic == 0x00000801:
            return "MNIST labels"
        return "IDX array"


def idx_info(path: str | os.PathLike[str]) -> IdxInfo:
    """Describe an IDX file: header, sizes, gzip or not, whether it is valid.

    The file is read through once (a chunk at a time) when it is gzip-compressed, a label
    file or a pipe, to measure its data and count labels; a plain image file is measured by
    its size. Reading stops one chunk past the declared size, as ``convert`` does, so a
    decompression bomb is reported as holding "at least" that much.

    Raises:
        IdxFormatError: the file cannot be read or its header cannot be parsed at all.
    """
    import numpy as np

    path = os.fspath(path)
    with open_raw(path) as raw:
        file_size = os.fstat(raw.fileno()).st_size
        stream, packing, streaming = open_data(raw, path)
        header = parse_header(stream, path, packing)
        gzipped = packing != "plain"
        count_labels = header.magic == 0x00000801
        problem = None
        at_least = False
        counts = np.zeros(256, dtype=np.int64) if count_labels else None
        if not gzipped and not count_labels and not streaming:
            data_size = file_size - header.header_size
        else:
            data_size = 0
            limit = header.payload_size + _CHUNK
            try:
                while chunk := stream.read(min(_CHUNK, limit - data_size)):
                    if counts is not None:
                        room = max(0, header.payload_size - data_size)
                        counts += np.bincount(
                            np.frombuffer(chunk[:room], dtype=np.uint8), minlength=256
                        )
                    data_size += len(chunk)
                    if data_size >= limit:
                        at_least = True
                        break
            except (gzip.BadGzipFile, zlib.error, lzma.LZMAError, EOFError, OSError) as exc:
                problem = f"{corrupt_stream(stream)} after {data_size} bytes of data: {exc}"
        if streaming and not gzipped:
            file_size = header.header_size + data_size
    if problem is None and data_size != header.payload_size:
        problem = str(size_error(header, data_size, at_least=at_least)).removeprefix(f"{path}: ")
    label_counts = (
        {int(v): int(n) for v, n in enumerate(counts) if n} if counts is not None else None
    )
    return IdxInfo(header, file_size, data_size, problem, label_counts, at_least, streaming)


@dataclass
class DbInfo:
    """What ``info`` reports on a database."""

    path: str
    backend: str
    count: int
    first_key: bytes | None
    last_key: bytes | None
    sequential_keys: bool
    shape: tuple[int, int, int] | None
    encoding: str | None
    label_counts: dict[int, int] = field(default_factory=dict)
    disk_size: int = 0
    problem: str | None = None


def _datum_encoding(datum: object) -> str:
    if getattr(datum, "encoded", False):
        return "encoded image (Datum.encoded)"
    if len(getattr(datum, "data", b"")):
        return "uint8 data"
    if len(getattr(datum, "float_data", ())):
        return "float_data"
    return "empty"


def db_info(path: str | os.PathLike[str], progress: ProgressCallback | None = None) -> DbInfo:
    """Describe a database: backend, records, key range, Datum shape and encoding, labels.

    Reads every record once, in one read transaction (LMDB readers neither wait for nor
    block other readers or a writer). ``problem`` names the first record that does not fit.

    Raises:
        BackendError: the path is not a database of either backend, or cannot be opened.
    """
    path = os.fspath(path)
    backend = detect_backend(path)
    info = DbInfo(path, backend, 0, None, None, True, None, None)
    counts: dict[int, int] = {}
    with shared_reader(path, backend) as reader:
        total = len(reader) if progress is not None else 0
        count = 0
        key = b""
        for key, value in reader:
            if count == 0:
                info.first_key = bytes(key)
            if info.sequential_keys and key != record_key(count):
                info.sequential_keys = False
            count += 1
            if info.problem is not None:
                continue
            try:
                datum = decode_datum(bytes(value))
                if not datum.encoded:
                    datum_to_array(datum)  # data length against channels × height × width
            except DatumError as exc:
                info.problem = f"key {_key_text(bytes(key))}: {exc}"
                continue
            shape = (int(datum.channels), int(datum.height), int(datum.width))
            encoding = _datum_encoding(datum)
            if info.shape is None:
                info.shape, info.encoding = shape, encoding
            elif shape != info.shape or encoding != info.encoding:
                info.problem = (
                    f"key {_key_text(bytes(key))}: Datum {'×'.join(map(str, shape))} "
                    f"{encoding}, the first record is {'×'.join(map(str, info.shape))} "
                    f"{info.encoding}"
                )
            counts[int(datum.label)] = counts.get(int(datum.label), 0) + 1
            if progress is not None and count % _BATCH == 0:
                progress(count, total)
        info.last_key = bytes(key) if count else None
    info.count = count
    # Measured after closing: opening a LevelDB database may rewrite its log into a table.
    info.disk_size = sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    )
    info.label_counts = dict(sorted(counts.items()))
    if progress is not None:
        progress(count, total)
    return info


# -- verify ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    count: int
    rows: int
    cols: int


def _describe_mismatch(key: bytes, value: bytes, image: np.ndarray, label: int) -> str:
    """Name the first field in which ``value`` differs from the Datum Caffe writes."""
    try:
        datum = decode_datum(value)
    except DatumError as exc:
        return f"key {_key_text(key)}: {exc}"
    rows, cols = image.shape
    for name, got, want in (
        ("channels", datum.channels, 1),
        ("height", datum.height, rows),
        ("width", datum.width, cols),
    ):
        if got != want:
            return f"key {_key_text(key)}: field {name} is {got}, the source has {want}"
    expected = image.tobytes()
    data = bytes(datum.data)
    if len(data) != len(expected):
        return (
            f"key {_key_text(key)}: field data holds {len(data)} bytes, "
            f"the source image has {len(expected)}"
        )
    if data != expected:
        diffs = [i for i in range(len(data)) if data[i] != expected[i]]
        row, col = divmod(diffs[0], cols)
        more = f" ({len(diffs)} bytes differ)" if len(diffs) > 1 else ""
        return (
            f"key {_key_text(key)}: field data differs at byte {diffs[0]} (row {row}, "
            f"column {col}): database {data[diffs[0]]}, source {expected[diffs[0]]}{more}"
        )
    if datum.label != label:
        return f"key {_key_text(key)}: field label is {datum.label}, the source has {label}"
    return (
        f"key {_key_text(key)}: value of {len(value)} bytes is not Caffe's encoding of "
        f"the source's fields (extra or reordered fields)"
    )


def verify_db(
    db: str | os.PathLike[str],
    images: str | os.PathLike[str],
    labels: str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
) -> VerifyResult:
    """Check that database ``db`` holds exactly what ``convert(images, labels)`` writes.

    The record counts are compared first; then every record is compared with the source,
    key and value, in one pass over the three inputs, a batch at a time. A value equal byte for byte to Caffe's encoding passes;
    otherwise the first differing field is named.

    Raises:
        VerifyError: a record differs (naming its key and field), records are missing, or
            the database holds records the source does not.
        IdxFormatError, BackendError: an input cannot be read.
    """
    db_path = os.fspath(db)
    with open_idx(images) as images_reader, open_idx(labels) as labels_reader:
        check_pair(images_reader.header, labels_reader.header)
        total = images_reader.header.count
        rows, cols = images_reader.header.dims[1:]
        with shared_reader(db_path) as reader:
            held = len(reader)
            if held != total:
                # Say so first: a database of the other split differs at key 0 already.
                differ = f"{total - held} missing" if held < total else f"{held - total} extra"
                raise VerifyError(
                    f"{db_path}: holds {held} records, the source has {total} "
                    f"({os.fspath(images)}): {differ}; is it the database of another split?"
                )
            records = iter(reader)
            index = 0
            for image_batch, label_batch in zip(
                images_reader.iter_batches(_BATCH), labels_reader.iter_batches(_BATCH), strict=True
            ):
                expected_values = encode_batch(image_batch, label_batch)
                for j, expected in enumerate(expected_values):
                    want_key = record_key(index)
                    record = next(records, None)
                    if record is None:
                        missing = total - index
                        raise VerifyError(
                            f"{db_path}: {missing} record{'s' if missing > 1 else ''} missing: "
                            f"the database ends after {index} records, the source has {total} "
                            f"(first missing key {want_key.decode()})"
                        )
                    key, value = bytes(record[0]), bytes(record[1])
                    if key != want_key:
                        if key > want_key:
                            raise VerifyError(
                                f"{db_path}: key {want_key.decode()} missing "
                                f"(the next key is {_key_text(key)})"
                            )
                        raise VerifyError(
                            f"{db_path}: key {_key_text(key)} is not in the source "
                            f"(expected key {want_key.decode()})"
                        )
                    if value != expected:
                        raise VerifyError(
                            f"{db_path}: "
                            + _describe_mismatch(key, value, image_batch[j], int(label_batch[j]))
                            + f" ({os.fspath(images)} item {index})"
                        )
                    index += 1
                if progress is not None:
                    progress(index, total)
            extra_first = next(records, None)
            if extra_first is not None:
                extra = 1
                last = bytes(extra_first[0])
                for last_key, _ in records:
                    extra += 1
                    last = bytes(last_key)
                first = _key_text(bytes(extra_first[0]))
                keys = first if extra == 1 else f"{first} to {_key_text(last)}"
                raise VerifyError(
                    f"{db_path}: {extra} extra record{'s' if extra > 1 else ''} not in the "
                    f"source ({total} items): key{'s' if extra > 1 else ''} {keys}"
                )
    return VerifyResult(total, rows, cols)
