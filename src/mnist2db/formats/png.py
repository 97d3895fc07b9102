"""Encoded Datums: PNG images in ``Datum.data`` (``--encoded png``), written and read.

Caffe's ``convert_imageset --encoded`` stores each image file's bytes in ``data``, sets
``encoded: true`` and leaves ``channels``, ``height`` and ``width`` 0; its DataTransformer
decodes them with OpenCV ``imdecode(..., IMREAD_UNCHANGED)``, in their native channels. mnist2db
writes grayscale PNGs, so a record decodes to exactly its pixels, 1 channel, and fills in
``channels=1``, ``height`` and ``width`` as well (NVIDIA/DIGITS#514), so that a reader knows
the shape without decoding.

The PNG writer is a small one of mnist2db's own (signature, ``IHDR``, one ``IDAT`` of
zlib at level :data:`PNG_LEVEL`, ``IEND``, each with its CRC-32; filter type 0 on every row):
deterministic for a given zlib, and several times faster than Pillow per image. Reading
goes through :mod:`mnist2db.formats.png_codec`: PNGs by zlib and numpy (Pillow for the kinds it
leaves), any other image (JPEG) by Pillow; every reader of the project calls
:func:`decode_image`.
"""

from __future__ import annotations

import struct
import zlib

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.protowire import encode_varint

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    import numpy as np


#: The encodings ``convert``/``create`` can write (``encoded=``); None writes raw pixels.
ENCODINGS = ("png",)
#: zlib's settings for the PNG data: level, method, window bits, memory level, strategy.
#: Z_RLE (deflate with runs of one repeated byte only) chosen by measurement on Fashion-MNIST
#: (docs/performance.md): as fast as level 1 and as small as level 6 on these images, whose
#: background is runs of zeros; filter None on every row is smaller than Sub or Up here.
#: The bytes are a function of the image and zlib's version only (no threads, no machine).
PNG_ZLIB = (1, zlib.DEFLATED, 15, 8, zlib.Z_RLE)
_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def check_encoding(encoded: str | None) -> None:
    """Refuse an unknown ``encoded`` value (one line naming the choices)."""
    from mnist2db.errors import ArgumentError

    if encoded is not None and encoded not in ENCODINGS:
        raise ArgumentError(
            f"unknown encoding {encoded!r}: expected one of {', '.join(ENCODINGS)} (or none)"
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
    return _SIGNATURE + _chunk(b"IHDR", struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0))


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


def encode_png(image: np.ndarray) -> bytes:
    """A grayscale PNG of one ``(rows, cols)`` uint8 image (what :func:`encode_png_batch`
    stores in ``Datum.data``).

    Raises:
        DatumError: a side of the image is 0.
    """
    rows, cols = image.shape
    check_png_shape(rows, cols, "image")
    return _header(rows, cols) + _idat(_scanlines(image[None])[0]) + _IEND


def _scanlines(images: np.ndarray) -> list[bytes]:
    """Each image's PNG scanlines: every row preceded by its filter type, 0 (None)."""
    import numpy as np

    n, rows, cols = images.shape
    matrix = np.zeros((n, rows, cols + 1), dtype=np.uint8)
    matrix[:, :, 1:] = images
    size = rows * (cols + 1)
    raw = matrix.tobytes()
    return [raw[i : i + size] for i in range(0, n * size, size)]


def _idat(scanlines: bytes) -> bytes:
    deflate = zlib.compressobj(*PNG_ZLIB)
    data = deflate.compress(scanlines) + deflate.flush()
    return (
        struct.pack(">I", len(data))
        + b"IDAT"
        + data
        + struct.pack(">I", zlib.crc32(data, _IDAT_CRC))
    )


_IDAT_CRC = zlib.crc32(b"IDAT")


def encode_png_batch(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Serialize one encoded Datum per image: ``channels=1``, ``height``, ``width``, ``data``
    a PNG of the image, ``label``, ``encoded=true`` (bytes as ``SerializeToString()``).

    The images are compressed on a few threads (zlib releases the GIL); each record's
    bytes depend only on its image and label, so they are the same whatever the threads.

    Args:
        images: uint8 array of shape ``(n, rows, cols)``.
        labels: integer array of shape ``(n,)``.

    Raises:
        DatumError: a side of the images is 0 (:func:`check_png_shape`).
    """
    n, rows, cols = images.shape
    check_png_shape(rows, cols, "images")
    if n == 0:
        return []
    from mnist2db.formats.threaded import run_chunks

    header = _header(rows, cols)
    head = b"\x08\x01\x10" + encode_varint(rows) + b"\x18" + encode_varint(cols) + b"\x22"
    scanlines = _scanlines(images)
    label_list = labels.tolist()
    fixed = len(header) + len(_IEND) + 12  # the PNG but for the compressed data

    def encode(start: int, stop: int) -> list[bytes]:
        out = []
        compressobj, crc32, pack = zlib.compressobj, zlib.crc32, struct.pack
        for i in range(start, stop):
            deflate = compressobj(*PNG_ZLIB)
            data = deflate.compress(scanlines[i]) + deflate.flush()
            label = label_list[i]
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
                        _IEND,
                        _TAILS[label]
                        if 0 <= label < 256
                        else b"\x28" + encode_varint(label) + b"\x38\x01",
                    )
                )
            )
        return out

    return run_chunks(encode, n)


#: ``label`` (field 5) and ``encoded: true`` (field 7), for every uint8 label.
_TAILS = [b"\x28" + encode_varint(label) + b"\x38\x01" for label in range(256)]


def is_png(data: bytes) -> bool:
    """True when ``data`` begins with the PNG signature."""
    return bytes(data[:8]) == _SIGNATURE


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


def decode_image(data: bytes, where: str) -> np.ndarray:
    """An encoded Datum's image as Caffe's data layer decodes it: ``(c, h, w)`` uint8, BGR
    for colour (OpenCV's order), 1 channel for grey (:mod:`mnist2db.formats.png_codec`: PNG by
    zlib and numpy, anything else by Pillow; 16-bit refused as Caffe refuses it).

    Raises:
        DatumError: the data is not an image that can be decoded, naming ``where``.
    """
    from mnist2db.formats.png_codec import decode_image as decode

    return decode(data, where)


def decode_images(datas: Sequence[bytes], wheres: Sequence[str]) -> list[np.ndarray]:
    """:func:`decode_image` of each, in order, on a few threads when there are many."""
    from mnist2db.formats.png_codec import decode_image as decode
    from mnist2db.formats.threaded import decode_many

    return decode_many(decode, datas, wheres)


def decoded_datum(datum: Any, where: str) -> Any:
    """``datum`` with an encoded image replaced by its raw pixels (``encoded`` false, the
    decoded shape); a raw Datum is returned as it is. Changes ``datum`` in place.

    Raises:
        DatumError: the image cannot be decoded.
    """
    if datum.encoded:
        image = decode_image(datum.data, where)
        datum.channels, datum.height, datum.width = (int(d) for d in image.shape)
        datum.data = image.tobytes()
        datum.encoded = False
    return datum
