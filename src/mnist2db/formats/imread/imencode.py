"""Images written as Caffe's OpenCV writes them (``cv::imencode`` with Caffe's defaults),
for ``convert_imageset --encode_type`` and ``imageset --encoded``.

PNG with the Sub filter on every row, zlib level 1 with ``Z_RLE`` and libpng's window and
8192-byte ``IDAT`` chunks; JPEG through Pillow's libjpeg at quality 95, 4:2:0; BMP as
OpenCV's writer lays it out. Other formats OpenCV writes (TIFF, WebP, PPM, ...) depend on
library settings that are not reproduced: they are refused, naming the choices. Reading
images is :mod:`mnist2db.formats.imread.reader`'s.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

from mnist2db.errors import ImageError
from mnist2db.formats.imread.encode_types import ENCODE_TYPES
from mnist2db.formats.png.encoder import PNG_SIGNATURE

#: libpng's IDAT chunk size, as OpenCV writes.
_IDAT_SIZE = 8192


def encode_image(image: np.ndarray, ext: str) -> bytes:
    """``cv::imencode("." + ext, image)`` with no parameters: ``image`` is ``(h, w)`` grey or
    ``(h, w, 3)`` BGR uint8.

    Raises:
        ImageError: ``ext`` is not one of :data:`ENCODE_TYPES`.
    """
    ext = ext.lower()
    if ext == "png":
        return encode_png(image)
    if ext in ("jpg", "jpeg", "jpe"):
        return encode_jpeg(image)
    if ext in ("bmp", "dib"):
        return encode_bmp(image)
    raise ImageError(
        f"cannot encode images as {ext!r}: the types written as Caffe writes them are "
        f"{', '.join(ENCODE_TYPES)}"
    )


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(body, zlib.crc32(kind))
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def encode_png(image: np.ndarray) -> bytes:
    """OpenCV's PNG: Sub filter on every row, zlib level 1 with ``Z_RLE`` and the window
    libpng picks for the image's size, ``IDAT`` chunks of 8192 bytes."""
    rows, cols = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    samples = image if channels == 1 else image[:, :, ::-1]  # png_set_bgr: stored RGB
    flat = np.ascontiguousarray(samples, dtype=np.uint8).reshape(rows, cols * channels)
    filtered = np.empty((rows, cols * channels + 1), dtype=np.uint8)
    filtered[:, 0] = 1  # Sub
    filtered[:, 1 : 1 + channels] = flat[:, :channels]
    filtered[:, 1 + channels :] = flat[:, channels:] - flat[:, :-channels]
    raw = filtered.tobytes()
    window = 15
    if len(raw) <= 16384:  # libpng's png_deflate_claim shrinks the window for small images
        half = 1 << (window - 1)
        while len(raw) + 262 <= half:
            half >>= 1
            window -= 1
    compressor = zlib.compressobj(1, zlib.DEFLATED, max(window, 9), 8, zlib.Z_RLE)
    stream = _optimize_cmf(compressor.compress(raw) + compressor.flush(), len(raw))
    header = struct.pack(">IIBBBBB", cols, rows, 8, 0 if channels == 1 else 2, 0, 0, 0)
    parts = [PNG_SIGNATURE, _chunk(b"IHDR", header)]
    for start in range(0, len(stream), _IDAT_SIZE):
        parts.append(_chunk(b"IDAT", stream[start : start + _IDAT_SIZE]))
    parts.append(_chunk(b"IEND", b""))
    return b"".join(parts)


def _optimize_cmf(stream: bytes, size: int) -> bytes:
    """libpng's ``optimize_cmf``: the zlib header names the smallest window that holds
    ``size`` bytes (the check bits recomputed), whatever window compressed them."""
    cmf = stream[0]
    if size > 16384 or cmf & 0x0F != 8 or cmf & 0xF0 > 0x70:
        return stream
    info = cmf >> 4
    half = 1 << (info + 7)
    if size > half:
        return stream
    while True:
        half >>= 1
        info -= 1
        if not (info > 0 and size <= half):
            break
    cmf = (cmf & 0x0F) | (info << 4)
    flags = stream[1] & 0xE0
    flags += 0x1F - ((cmf << 8) + flags) % 0x1F
    return bytes((cmf, flags)) + stream[2:]


def encode_jpeg(image: np.ndarray) -> bytes:
    """OpenCV's JPEG: libjpeg's defaults at quality 95 (4:2:0 for colour, baseline)."""
    from PIL import Image

    picture = Image.fromarray(image if image.ndim == 2 else image[:, :, ::-1].copy())
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=95)
    return out.getvalue()


def encode_bmp(image: np.ndarray) -> bytes:
    """OpenCV's BMP: bottom-up rows padded to 4 bytes, a grey ramp palette for grey images."""
    rows, cols = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    width = cols * channels
    step = (width + 3) & -4
    palette = b"".join(bytes((i, i, i, 0)) for i in range(256)) if channels == 1 else b""
    header_size = 14 + 40 + len(palette)
    body = np.zeros((rows, step), dtype=np.uint8)
    body[:, :width] = np.ascontiguousarray(image, dtype=np.uint8).reshape(rows, width)
    return (
        b"BM"
        + struct.pack("<IiI", header_size + step * rows, 0, header_size)
        + struct.pack("<IiiHHIIiiII", 40, cols, rows, 1, channels * 8, 0, 0, 0, 0, 0, 0)
        + palette
        + body[::-1].tobytes()
    )
