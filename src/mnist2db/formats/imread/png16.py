"""The full 16-bit samples of a colour PNG, which Pillow reduces to their high bytes.

libpng converts colour to grey (OpenCV's ``IMREAD_GRAYSCALE``) on the 16-bit samples and
only then keeps the high byte, so the grey value of a 16-bit colour PNG depends on the low
bytes too. This reads the samples itself: the ``IDAT`` chunks inflated, the rows
unfiltered (Sub and Up vectorised; Average and Paeth pixel by pixel, across the channels at
once), inflated no further than the header's size declares. Interlaced images are left to
Pillow (``None``).
"""

from __future__ import annotations

import struct
import zlib
from typing import IO

import numpy as np


def _chunks(fp: IO[bytes]) -> tuple[bytes, bytes]:
    """The ``IHDR`` body and the joined ``IDAT`` data of the PNG in ``fp``."""
    fp.seek(8)
    header = b""
    data = bytearray()
    while True:
        head = fp.read(8)
        if len(head) < 8:
            raise ValueError("truncated PNG: no IEND chunk")
        length, kind = struct.unpack(">I4s", head)
        body = fp.read(length)
        fp.read(4)
        if len(body) < length:
            raise ValueError(f"truncated PNG: {kind.decode('latin-1')} chunk cut short")
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
        elif kind == b"IEND":
            return header, bytes(data)


def decode_png16(fp: IO[bytes], size: tuple[int, int]) -> np.ndarray:
    """``(h, w, 3)`` uint16 RGB of a 16-bit RGB or RGBA PNG (alpha dropped).

    Raises:
        ValueError: the PNG is damaged, or interlaced (not handled here).
    """
    where = fp.tell()
    try:
        header, data = _chunks(fp)
    finally:
        fp.seek(where)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if (width, height) != tuple(size) or depth != 16 or colour not in (2, 6):
        raise ValueError("not a 16-bit colour PNG")
    if interlace:
        raise ValueError("interlaced 16-bit colour PNGs are not supported")
    channels = 3 if colour == 2 else 4
    bpp = 2 * channels
    stride = width * bpp
    expected = height * (stride + 1)
    try:
        # Inflated up to what the header declares, never past it: a small header may hide
        # gigabytes of data (libpng, too, stops at the last row and ignores the rest).
        raw = np.frombuffer(zlib.decompressobj().decompress(data, expected), dtype=np.uint8)
    except zlib.error as exc:
        raise ValueError(f"PNG image data is damaged: {exc}") from None
    if len(raw) < expected:
        raise ValueError("PNG image data is cut short")
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = int(rows[y, 0]), rows[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:
            row = (
                (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) % 256)
                .astype(np.uint8)
                .reshape(stride)
            )
        elif kind == 2:
            row = line + previous
        elif kind in (3, 4):
            row = _sequential(line, previous, bpp, kind)
        else:
            raise ValueError(f"unknown PNG filter type {kind}")
        out[y] = row
        previous = row
    samples = out.reshape(height, width, channels, 2).astype(np.uint16)
    return (samples[:, :, :3, 0] << 8) | samples[:, :, :3, 1]


def _sequential(line: np.ndarray, above: np.ndarray, bpp: int, kind: int) -> np.ndarray:
    """Unfilter Average (3) or Paeth (4): each pixel depends on the one before it."""
    pixels = line.reshape(-1, bpp).astype(np.int32)
    up = above.reshape(-1, bpp).astype(np.int32)
    out = np.zeros_like(pixels)
    left = np.zeros(bpp, dtype=np.int32)
    corner = np.zeros(bpp, dtype=np.int32)
    for x in range(len(pixels)):
        b = up[x]
        if kind == 3:
            predicted = (left + b) >> 1
        else:
            p = left + b - corner
            pa, pb, pc = np.abs(p - left), np.abs(p - b), np.abs(p - corner)
            predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, b, corner))
        value = (pixels[x] + predicted) & 0xFF
        out[x] = value
        left, corner = value, b
    return out.astype(np.uint8).reshape(-1)
