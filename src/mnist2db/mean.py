"""The mean image of a Datum database, as Caffe's ``compute_image_mean`` writes it.

Caffe sums every record's pixels into a ``BlobProto`` of float32, record by record in key
order (``sum = sum + pixel``), then divides each element by the record count in float32,
and writes the ``BlobProto`` with ``num=1``, ``channels``, ``height``, ``width`` and packed
``data``; no ``shape``. float32 sums of uint8 values are exact only below 2**24 (65 793
records of 255); past that the result depends on the order of the additions, so the sums
here are sequential float32 additions in key order too: ``numpy.cumsum`` along the record
axis of a batch whose first row is the running sum (an accumulation is sequential, unlike
``numpy.sum``'s pairwise summation), one batch at a time. The bytes are Caffe's for any
database. The standard deviation (not in Caffe's file) is computed exactly from integer
sums of pixels and squared pixels.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mnist2db.errors import DatumError, Mnist2dbError, OutputError
from mnist2db.formats.datum.message import key_text
from mnist2db.formats.imdecode.png_decoder import decoded_datum
from mnist2db.formats.protowire import encode_varint
from mnist2db.progress import Progress, reporting
from mnist2db.storage.databases.backends import (
    DEFAULT_BATCH_SIZE,
    batch_full,
    check_batch_size,
    detect_backend,
)
from mnist2db.storage.databases.readers import iter_db
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import AtomicFile

if TYPE_CHECKING:
    from mnist2db.storage.files import PathArg


#: Bytes of numpy work arrays per summing step (a slice of the pixels of a batch).
_WORK_BYTES = 64 << 20


class MeanResult(NamedTuple):
    """What :func:`compute_mean` found (immutable).

    Fields: ``path``, ``backend``, ``count`` (records), ``mean`` (float32 array of shape
    ``(channels, height, width)``, Caffe's mean image), ``channel_means`` and
    ``channel_stds`` (per channel, over every pixel of every record, on the 0–255 scale).
    """

    path: str
    backend: str
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    mean: np.ndarray
    channel_means: tuple[float, ...]
    channel_stds: tuple[float, ...]

    def caffe_channel_means(self) -> list[float]:
        """Caffe's logged ``mean_value channel [c]``: a float32 sum of the channel's mean
        pixels in order, divided by their number in float32."""
        channels = self.mean.shape[0]
        flat = self.mean.reshape(channels, -1)
        values = []
        for c in range(channels):
            total = np.cumsum(flat[c], dtype=np.float32)[-1] if flat.shape[1] else 0
            values.append(float(np.float32(total) / np.float32(flat.shape[1])))
        return values


def _records(path: str, backend: str | None) -> Iterator[tuple[bytes, Any]]:
    """The database's ``(key, Datum)`` in key order: the one place the readers are used."""
    return iter_db(path, backend)


def _pixels(key: bytes, datum: Any, path: str) -> tuple[tuple[int, int, int], Any]:
    """A record's shape and its values as a flat numpy array (uint8 data or float32)."""
    name = key_text(key)
    # An encoded image is decoded first, as Caffe's DecodeDatumNative does.
    datum = decoded_datum(datum, f"{path}: key {name}")
    shape = (int(datum.channels), int(datum.height), int(datum.width))
    size = shape[0] * shape[1] * shape[2]
    if size == 0:  # checked by the reader as Caffe takes it; a mean needs pixels (and no
        # per-channel sums of a record of 2^31-1 channels and no pixels)
        raise DatumError(f"{path}: key {name}: Datum {shape} has no pixels to average")
    if len(datum.data):
        values = np.frombuffer(datum.data, dtype=np.uint8)
    else:
        values = np.array(datum.float_data, dtype=np.float32)
    if len(values) != size:
        raise Mnist2dbError(
            f"{path}: key {name}: {len(values)} values, but channels × height × width "
            f"{' × '.join(map(str, shape))} needs {size}"
        )
    return shape, values


def compute_mean(
    path: PathArg,
    backend: str | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> MeanResult:
    """Compute Caffe's mean image of the database at ``path``, streaming a batch at a time.

    Args:
        path: an LMDB or LevelDB database of Datums (backend detected when None).
        batch_size: records summed per step, at most (a step also holds at most
            :data:`~mnist2db.storage.databases.backends.BATCH_BYTES_LIMIT` of pixels: memory does not grow with the record size).
        progress: called as ``progress(records_done, 0)`` every ``batch_size`` records
            and at the end.

    Returns:
        A :class:`MeanResult`.

    Raises:
        BackendError: ``path`` is not a database.
        DatumError: a value is not a Datum.
        Mnist2dbError: the database is empty, or its records differ in shape.
    """
    progress = reporting(progress)

    path = os.fsdecode(path)
    check_batch_size(batch_size)

    backend = backend or detect_backend(path)
    shape: tuple[int, int, int] | None = None
    total: Any = None  # float32 running sum, Caffe's sum_blob
    # Exact per-channel sums of pixels and squared pixels: Python ints for uint8 data.
    sums: list[Any] = []
    squares: list[Any] = []
    count = 0
    pending: list[Any] = []
    pending_bytes = 0

    def flush() -> None:
        n = len(pending)
        size = total.size
        # Sequential float32 additions down the record axis: Caffe's order, exactly. Each
        # pixel's sum is its own, so the pixels are summed a slice at a time: the work
        # arrays stay within _WORK_BYTES however large a record is.
        step = max(1, _WORK_BYTES // (4 * (n + 1)))
        for a in range(0, size, step):
            b = min(size, a + step)
            block = np.empty((n + 1, b - a), dtype=np.float32)
            block[0] = total[a:b]
            for row, values in enumerate(pending, start=1):
                block[row] = values[a:b]
            np.cumsum(block, axis=0, dtype=np.float32, out=block)
            total[a:b] = block[-1]
        wide_type = np.int64 if pending[0].dtype == np.uint8 else np.float64
        exact = int if wide_type is np.int64 else float
        pixels = size // len(sums)
        step = max(1, _WORK_BYTES // (17 * n))  # the slice, its int64 copy and its squares
        for c in range(len(sums)):
            for a in range(c * pixels, (c + 1) * pixels, step):
                b = min((c + 1) * pixels, a + step)
                part = np.stack([values[a:b] for values in pending]).astype(wide_type)
                sums[c] += exact(part.sum())
                squares[c] += exact((part * part).sum())
        pending.clear()

    for key, datum in _records(path, backend):
        record_shape, values = _pixels(key, datum, path)
        if shape is None:
            shape = record_shape
            total = np.zeros(values.size, dtype=np.float32)
            sums, squares = [0] * shape[0], [0] * shape[0]
        elif record_shape != shape:
            raise Mnist2dbError(
                f"{path}: key {key.decode('ascii', errors='backslashreplace')}: shape "
                f"{' × '.join(map(str, record_shape))} differs from the first record's "
                f"{' × '.join(map(str, shape))}"
            )
        pending.append(values)
        pending_bytes += values.nbytes
        del datum, values  # a large record is held once, in pending, not twice
        count += 1
        # A batch is at most batch_size records and BATCH_BYTES_LIMIT of pixels: records of any
        # size (a 9000 × 9000 PNG decodes to 81 MB) are summed a few at a time.
        if batch_full(len(pending), pending_bytes, batch_size):
            flush()
            pending_bytes = 0
        if count % batch_size == 0:
            progress(count, 0)
    if shape is None:
        raise Mnist2dbError(f"{path}: the database holds no records; a mean needs at least one")
    if pending:
        flush()
    if count % batch_size:
        progress(count, 0)
    mean = (total / np.float32(count)).astype(np.float32).reshape(shape)
    pixels = count * shape[1] * shape[2]
    means = tuple(float(s) / pixels if pixels else 0.0 for s in sums)
    stds = tuple(
        math.sqrt(max(float(q) / pixels - m * m, 0.0)) if pixels else 0.0
        for q, m in zip(squares, means, strict=True)
    )
    return MeanResult(path, backend, count, mean, means, stds)


def mean_image(
    db: PathArg,
    out: PathArg | None = None,
    *,
    backend: str | None = None,
    overwrite: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> MeanResult:
    """``mnist2db mean DB [OUT]``: :func:`compute_mean` of ``db``, written to ``out`` by
    :func:`write_mean` (Caffe's BlobProto, or ``.npy``) when given; ``out`` is checked
    before the database is read, so a bad target fails at once.

    Raises:
        OutputExistsError: ``out`` may not be written (see :func:`check_mean_target`).
        Mnist2dbError: see :func:`compute_mean` and :func:`write_mean`.
    """
    if out is not None:
        check_mean_target(out, overwrite, [db])
    result = compute_mean(db, backend, batch_size=batch_size, progress=progress)
    if out is not None:
        write_mean(result, out, overwrite=overwrite)
    return result


def blobproto_bytes(mean: np.ndarray) -> bytes:
    """Serialize a ``(channels, height, width)`` float32 mean as Caffe's ``BlobProto``.

    The fields Caffe's ``compute_image_mean`` sets, in field-number order: ``num`` (1) = 1,
    ``channels`` (2), ``height`` (3), ``width`` (4), then ``data`` (5) as a packed run of
    little-endian float32 values — exactly ``BlobProto.SerializeToString()``.
    """
    channels, height, width = (int(d) for d in mean.shape)
    data = np.ascontiguousarray(mean, dtype="<f4").tobytes()
    head = b"".join(
        bytes([tag]) + encode_varint(value)
        for tag, value in ((0x08, 1), (0x10, channels), (0x18, height), (0x20, width))
    )
    # An empty packed field is not written at all, as protobuf does.
    body = b"\x2a" + encode_varint(len(data)) + data if data else b""
    return head + body


def check_mean_target(
    out: PathArg,
    overwrite: bool = False,
    inputs: Sequence[PathArg] = (),
) -> None:
    """Raise unless the mean may be written to ``out``: call it before computing the mean,
    so that a bad target fails at once, not after reading the whole database.

    Args:
        inputs: the database(s) the mean is computed from: ``out`` may be neither one of
            them nor a file inside one (:func:`mnist2db.storage.file_placement.check_file_target`).

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is false, it is not a file, or it
            is (or is inside) one of ``inputs``.
        Mnist2dbError: its directory does not exist or cannot be written.
    """

    check_file_target(os.fsdecode(out), overwrite, [os.fsdecode(i) for i in inputs])


def write_mean(
    result: MeanResult,
    out: PathArg,
    *,
    overwrite: bool = False,
    npy: bool | None = None,
) -> int:
    """Write the mean to ``out``: Caffe's BlobProto bytes, or the float32
    ``(channels, height, width)`` array as ``.npy`` (``npy``; None: when ``out`` ends in
    ``.npy``). Atomic (temporary file, then rename).

    Returns:
        The number of bytes written.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is false, it is not a file, or
            it is the database the mean was computed from (or a file inside it).
        Mnist2dbError: the file cannot be written.
    """

    out = os.fsdecode(out)
    check_mean_target(out, overwrite, [result.path])
    if npy is None:
        npy = out.endswith(".npy")
    if npy:
        buffer = io.BytesIO()
        np.save(buffer, result.mean.astype(np.float32), allow_pickle=False)
        payload = buffer.getvalue()
    else:
        payload = blobproto_bytes(result.mean)
    try:
        with AtomicFile(out) as target:
            target.stream.write(payload)
            target.commit()
    except OSError as exc:
        raise OutputError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return len(payload)
