"""Encoded Datums: PNG images in ``Datum.data`` (``--encoded png``), written and read.

Caffe's ``convert_imageset --encoded`` stores each image file's bytes in ``data``, sets
``encoded: true`` and leaves ``channels``, ``height`` and ``width`` 0; its DataTransformer
decodes them with OpenCV ``imdecode(..., IMREAD_UNCHANGED)``, in their native channels. mnist2db
writes grayscale PNGs, so a record decodes to exactly its pixels, 1 channel, and fills in
``channels=1``, ``height`` and ``width`` as well (NVIDIA/DIGITS#514), so that a reader knows
the shape without decoding.

The PNG writer is a small one of mnist2db's own (signature, ``IHDR``, one ``IDAT``, ``IEND``,
each with its CRC-32; filter type 0 on every row), with two compressions
(:data:`PNG_COMPRESSIONS`): ``"fast"`` (the default), mnist2db's own deflate
(:mod:`mnist2db.formats.deflate`), whose bytes are a function of the image alone; and
``"small"``, zlib at :data:`PNG_ZLIB`, deterministic for a given zlib. Both are several
times faster than Pillow per image. Reading
is :mod:`mnist2db.formats.png_codec`'s: PNGs by zlib and numpy (Pillow for the kinds it
leaves), any other image (JPEG) by Pillow; every reader of the project calls its
:func:`~mnist2db.formats.png_codec.decode_datum_image`.
"""

from __future__ import annotations

import struct
import zlib

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.deflate import max_stream_size, zlib_stream, zlib_streams
from mnist2db.formats.protowire import encode_varint

if TYPE_CHECKING:
    import numpy as np


#: The encodings ``convert``/``create`` can write (``encoded=``); None writes raw pixels.
ENCODINGS = ("png",)
#: How the PNG data is compressed (``png_compression=``, ``--png-compression``):
#: ``"fast"``, mnist2db's own deflate (:mod:`mnist2db.formats.deflate`: fixed Huffman codes,
#: run-length matches; ~1.13× the size of ``"small"`` on Fashion-MNIST, several times
#: faster to write and twice as fast to inflate, the bytes a function of the image
#: alone); ``"small"``, zlib with :data:`PNG_ZLIB` (the bytes of mnist2db before 0.2,
#: which depend on zlib's version). A database records its choice; one that does not
#: (written before the choice existed) was written with ``"small"``.
PNG_COMPRESSIONS = ("fast", "small")
DEFAULT_PNG_COMPRESSION = "fast"
#: What a database's recipe without ``png_compression`` was written with.
OLD_PNG_COMPRESSION = "small"
#: zlib's settings for ``"small"``: level, method, window bits, memory level, strategy.
#: Z_RLE (deflate with runs of one repeated byte only) chosen by measurement on Fashion-MNIST
#: (docs/performance.md): as fast as level 1 and as small as level 6 on these images, whose
#: background is runs of zeros; filter None on every row is smaller than Sub or Up here.
#: The bytes are a function of the image and zlib's version only (no threads, no machine).
PNG_ZLIB = (1, zlib.DEFLATED, 15, 8, zlib.Z_RLE)
#: Every PNG starts with these 8 bytes.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The IEND chunk: every PNG ends with these 12 bytes.
IEND_CHUNK = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def check_encoding(encoded: str | None) -> None:
    """Refuse an unknown ``encoded`` value (one line naming the choices)."""
    from mnist2db.errors import ArgumentError

    if encoded is not None and encoded not in ENCODINGS:
        raise ArgumentError(
            f"unknown encoding {encoded!r}: expected one of {', '.join(ENCODINGS)} (or none)"
        )


def check_png_compression(compression: str, encoded: str | None = "png") -> None:
    """Refuse an unknown ``png_compression``, or one other than the default without
    ``encoded="png"`` (it would change nothing: raw records are not compressed).

    Raises:
        ArgumentError: one line naming the choices, or what is missing.
    """
    from mnist2db.errors import ArgumentError

    if compression not in PNG_COMPRESSIONS:
        raise ArgumentError(
            f"unknown PNG compression {compression!r}: expected one of "
            f"{', '.join(PNG_COMPRESSIONS)}"
        )
    if encoded != "png" and compression != DEFAULT_PNG_COMPRESSION:
        raise ArgumentError(
            f"PNG compression {compression!r} compresses PNG records: ask for encoded='png' too"
        )


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))
    )


def _header(rows: int, cols: int) -> bytes:
    # width, height, bit depth 8, colour type 0 (grey), deflate, filter method 0, no interlace
    return PNG_SIGNATURE + _chunk(b"IHDR", struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0))


def check_png_shape(rows: int, cols: int, where: str) -> None:
    """Refuse images a PNG cannot hold (a side of 0 pixels, or one above 2^31-1), before
    any work.

    Raises:
        DatumError: naming ``where``.
    """
    from mnist2db.errors import DatumError

    if rows <= 0 or cols <= 0 or rows >= 1 << 31 or cols >= 1 << 31:
        raise DatumError(
            f"{where}: images of {rows}x{cols} pixels cannot be PNG-encoded: a PNG's sides "
            "are 1 to 2^31-1 pixels"
        )


def encode_png(image: np.ndarray, compression: str = DEFAULT_PNG_COMPRESSION) -> bytes:
    """A grayscale PNG of one ``(rows, cols)`` uint8 image (what :func:`encode_png_batch`
    stores in ``Datum.data``), compressed as ``compression`` says (:data:`PNG_COMPRESSIONS`).

    Raises:
        DatumError: a side of the image is 0.
        ArgumentError: an unknown compression.
    """
    rows, cols = image.shape
    check_png_shape(rows, cols, "image")
    check_png_compression(compression)
    scanlines = _scanlines(image[None])
    if compression == "fast":
        data = zlib_stream(scanlines.tobytes())
    else:
        deflate = zlib.compressobj(*PNG_ZLIB)
        data = deflate.compress(scanlines.tobytes()) + deflate.flush()
    return _header(rows, cols) + _chunk(b"IDAT", data) + IEND_CHUNK


def _scanlines(images: np.ndarray) -> np.ndarray:
    """Each image's PNG scanlines, ``(n, rows * (cols + 1))``: every row preceded by its
    filter type, 0 (None)."""
    import numpy as np

    n, rows, cols = images.shape
    matrix = np.zeros((n, rows, cols + 1), dtype=np.uint8)
    matrix[:, :, 1:] = images
    return matrix.reshape(n, rows * (cols + 1))


_IDAT_CRC = zlib.crc32(b"IDAT")


def encode_png_batch(
    images: np.ndarray, labels: np.ndarray, compression: str = DEFAULT_PNG_COMPRESSION
) -> list[bytes]:
    """Serialize one encoded Datum per image: ``channels=1``, ``height``, ``width``, ``data``
    a PNG of the image, ``label``, ``encoded=true`` (bytes as ``SerializeToString()``).

    ``"small"`` compresses the images on a few threads (zlib releases the GIL); each
    record's bytes depend only on its image, its label and ``compression`` (for
    ``"small"``, zlib's version too), so they are the same whatever the threads or the
    batch.

    Args:
        images: uint8 array of shape ``(n, rows, cols)``.
        labels: integer array of shape ``(n,)``.
        compression: ``"fast"`` or ``"small"`` (:data:`PNG_COMPRESSIONS`).

    Raises:
        DatumError: a side of the images is 0 (:func:`check_png_shape`).
        ArgumentError: an unknown compression.
    """
    n, rows, cols = images.shape
    check_png_shape(rows, cols, "images")
    check_png_compression(compression)
    if n == 0:
        return []
    header = _header(rows, cols)
    head = b"\x08\x01\x10" + encode_varint(rows) + b"\x18" + encode_varint(cols) + b"\x22"
    if compression == "small":
        from mnist2db.formats.thread_pool import run_chunks

        label_list = labels.tolist()
        return run_chunks(
            lambda start, stop: _encode_small(images, start, stop, head, header, label_list),
            n,
        )
    # In this thread: numpy's steps are too short for threads to gain (measured: 2 threads
    # took 1.3x the time of one, waiting for the GIL); zlib's whole images are not.
    return _encode_fast(images, labels, head, header)


#: Bytes of an IDAT chunk but for its data: length, type, CRC-32.
_IDAT_FRAME = 12
#: The most bytes a label's field takes: its tag, a 10-byte varint (a negative label), and
#: ``encoded: true``.
_TAIL_MOST = 13


def encode_grey_pngs(images: np.ndarray) -> list[bytes]:
    """The PNG of each of ``images`` (uint8, ``(n, rows, cols)``) with the "fast"
    compression: the bytes :func:`encode_png_batch` stores in each record's ``data`` (its
    encoder, each PNG cut once from the one buffer it lays out).

    Raises:
        DatumError: a side of the images is 0 (:func:`check_png_shape`).
    """
    import numpy as np

    n, rows, cols = images.shape
    check_png_shape(rows, cols, "images")
    if n == 0:
        return []
    head = b"\x08\x01\x10" + encode_varint(rows) + b"\x18" + encode_varint(cols) + b"\x22"
    data, spans = _fast_layout(images, np.zeros(n, np.int64), head, _header(rows, cols))
    return [data[a:b] for a, b in zip(spans[2].tolist(), spans[3].tolist(), strict=True)]


def _encode_fast(images: np.ndarray, labels: np.ndarray, head: bytes, header: bytes) -> list[bytes]:
    """The records of ``images`` with the "fast" compression, laid out in one buffer
    (:func:`_fast_layout`)."""
    data, spans = _fast_layout(images, labels, head, header)
    return [data[a:b] for a, b in zip(spans[0].tolist(), spans[1].tolist(), strict=True)]


def _fast_layout(
    images: np.ndarray, labels: np.ndarray, head: bytes, header: bytes
) -> tuple[bytes, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The records of ``images`` with the "fast" compression, laid out in one buffer, and
    where each is in it: the records' starts and ends, their PNGs' starts and ends.

    :func:`mnist2db.formats.deflate.zlib_streams` leaves room around each image's zlib
    stream; every other byte of its record is written there by numpy for all at once
    (the Datum's fields, the PNG's header, chunk frame and end, the label), so that per
    record Python computes one CRC-32 and takes one slice.
    """
    import numpy as np

    n, rows, cols = images.shape
    fixed = len(header) + _IDAT_FRAME + len(IEND_CHUNK)  # the PNG but for the zlib stream
    width = len(encode_varint(fixed + max_stream_size(rows * (cols + 1))))
    before = len(head) + width + len(header) + 8
    buffer, starts, ends = zlib_streams(
        _scanlines(images), before, 4 + len(IEND_CHUNK) + _TAIL_MOST
    )
    sizes = (ends - starts + fixed).astype(np.uint64)  # each PNG's
    size_bytes = _varint_sizes(sizes)
    png_starts = starts - (len(header) + 8)
    record_starts = png_starts - size_bytes - len(head)
    _put(buffer, record_starts, head)
    _put_varints(buffer, png_starts - size_bytes, sizes, size_bytes)
    _put(buffer, png_starts, header)
    four = np.arange(4)
    buffer[(starts - 8)[:, None] + four] = (
        (ends - starts).astype(">u4").view(np.uint8).reshape(n, 4)
    )
    _put(buffer, starts - 4, b"IDAT")
    view = buffer.data
    crc32 = zlib.crc32
    crcs = [crc32(view[a - 4 : b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    buffer[ends[:, None] + four] = np.array(crcs, ">u4").view(np.uint8).reshape(n, 4)
    _put(buffer, ends + 4, IEND_CHUNK + b"\x28")
    values = labels.astype(np.int64).view(np.uint64)
    label_bytes = _varint_sizes(values)
    label_starts = ends + (4 + len(IEND_CHUNK) + 1)
    _put_varints(buffer, label_starts, values, label_bytes)
    record_ends = label_starts + label_bytes + 2
    buffer[record_ends - 2] = 0x38  # encoded (field 7): true
    buffer[record_ends - 1] = 0x01
    png_ends = ends + (4 + len(IEND_CHUNK))
    return buffer.tobytes(), (record_starts, record_ends, png_starts, png_ends)


def _put(buffer: np.ndarray, starts: np.ndarray, data: bytes) -> None:
    """``data`` at each of ``starts``."""
    import numpy as np

    buffer[starts[:, None] + np.arange(len(data))] = np.frombuffer(data, np.uint8)


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """The bytes of each (uint64) value's varint: 1 to 10."""
    import numpy as np

    sizes = np.ones(len(values), np.int64)
    for k in range(1, 10):
        sizes += values >= np.uint64(1 << (7 * k))
    return sizes


def _put_varints(
    buffer: np.ndarray, starts: np.ndarray, values: np.ndarray, sizes: np.ndarray
) -> None:
    """Each (uint64) value's varint, of ``sizes`` bytes, at its start (protobuf's encoding:
    :func:`mnist2db.formats.protowire.encode_varint`)."""
    import numpy as np

    for k in range(int(sizes.max())):
        more = sizes > k
        byte = (values[more] >> np.uint64(7 * k)) & np.uint64(0x7F)
        byte |= np.where(sizes[more] > k + 1, np.uint64(0x80), np.uint64(0))
        buffer[starts[more] + k] = byte


def _encode_small(
    images: np.ndarray, start: int, stop: int, head: bytes, header: bytes, labels: list[int]
) -> list[bytes]:
    """The records of ``images[start:stop]`` compressed by zlib (``"small"``)."""
    out = []
    fixed = len(header) + len(IEND_CHUNK) + 12
    compressobj, crc32, pack = zlib.compressobj, zlib.crc32, struct.pack
    for i, scanlines in enumerate(_scanlines(images[start:stop])):
        deflate = compressobj(*PNG_ZLIB)
        data = deflate.compress(scanlines) + deflate.flush()
        label = labels[start + i]
        out.append(
            b"".join(
                (
                    head,
                    encode_varint(fixed + len(data)),
                    header,
                    pack(">I", len(data)),
                    b"IDAT",
                    data,
                    pack(">I", crc32(data, _IDAT_CRC)),
                    IEND_CHUNK,
                    _TAILS[label] if 0 <= label < 256 else _tail(label),
                )
            )
        )
    return out


def _tail(label: int) -> bytes:
    """``label`` (field 5) and ``encoded: true`` (field 7)."""
    return b"\x28" + encode_varint(label) + b"\x38\x01"


#: :func:`_tail` of every uint8 label.
_TAILS = [_tail(label) for label in range(256)]


def is_png(data: bytes) -> bool:
    """True when ``data`` begins with the PNG signature."""
    return bytes(data[:8]) == PNG_SIGNATURE


def datum_encoding(datum: object) -> str:
    """How a Datum holds its image, as ``info`` names it."""
    if getattr(datum, "encoded", False):
        kind = "PNG-encoded" if is_png(getattr(datum, "data", b"")) else "encoded"
        return f"{kind} image (Datum.encoded)"
    if len(getattr(datum, "data", b"")):
        return "uint8 data"
    if len(getattr(datum, "float_data", ())):
        return "float_data"
    return "empty"
