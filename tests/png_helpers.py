"""Test helpers for PNG records: PNGs of any encoder, Datums as mnist2db writes them, and
hostile variants of them."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from mnist2db.formats.datum.message import decode_datum
from mnist2db.formats.protowire import encode_varint

#: zlib settings (level, strategy) of the encoders: today's Z_RLE, the fixed-Huffman one,
#: zlib's default, Huffman only, and stored blocks.
ENCODERS = {
    "rle": (1, zlib.Z_RLE),
    "fixed": (9, zlib.Z_FIXED),
    "default": (6, zlib.Z_DEFAULT_STRATEGY),
    "huffman": (6, zlib.Z_HUFFMAN_ONLY),
    "stored": (0, zlib.Z_DEFAULT_STRATEGY),
}


def same(found: tuple[np.ndarray, int], expected: tuple[np.ndarray, int] | str) -> None:
    """``found`` is the record ``expected`` describes (not an error text): the same dtype,
    shape and pixels, and the same label, an int."""
    assert not isinstance(expected, str), expected
    assert found[0].dtype == expected[0].dtype and found[0].shape == expected[0].shape
    np.testing.assert_array_equal(found[0], expected[0])
    assert found[1] == expected[1] and type(found[1]) is int


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_of(
    image: np.ndarray,
    encoder: str = "rle",
    *,
    filters: bytes | None = None,
    colour: int = 0,
    raw: bytes | None = None,
) -> bytes:
    """A PNG of ``image`` ((h, w) grey, or (h, w, 3) colour), each row's filter byte from
    ``filters`` (0: the row as it is), its image data ``raw`` if given."""
    height, width = image.shape[:2]
    rows = image.reshape(height, -1)
    if raw is None:
        marks = filters if filters is not None else bytes(height)
        raw = b"".join(bytes((marks[r],)) + rows[r].tobytes() for r in range(height))
    level, strategy = ENCODERS[encoder]
    deflate = zlib.compressobj(level, zlib.DEFLATED, 15, 8, strategy)
    data = deflate.compress(raw) + deflate.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )


def record(png: bytes, label: int, rows: int = 28, cols: int = 28) -> bytes:
    """A Datum as mnist2db writes it: channels, height, width, data, label, encoded."""
    head = b"\x08\x01\x10" + encode_varint(rows) + b"\x18" + encode_varint(cols) + b"\x22"
    return head + encode_varint(len(png)) + png + b"\x28" + encode_varint(label) + b"\x38\x01"


def image_of(seed: int, rows: int = 28, cols: int = 28) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    image[:, : cols // 3] = 0  # runs, as in MNIST's backgrounds
    return image


def resealed(value: bytes, edit) -> bytes:  # type: ignore[no-untyped-def]
    """``value`` with its IDAT data edited by ``edit`` and the IDAT chunk's length and CRC
    made right again (the Datum's lengths too): only what ``edit`` did is wrong."""
    datum = decode_datum(value)
    png = bytes(datum.data)
    length = int.from_bytes(png[33:37], "big")
    data = edit(png[41 : 41 + length])
    png = png[:33] + chunk(b"IDAT", data) + png[45 + length :]
    return record(png, int(datum.label), int(datum.height), int(datum.width))


def hostile_records() -> dict[str, bytes]:
    """Records of a 28x28 image, label 4, each wrong (or unusual) in one way, by name."""
    image = image_of(1)
    png = png_of(image)
    good = record(png, 4)
    filtered = bytearray(image.shape[0])
    filtered[5] = 1  # Sub on row 5: valid, and not what the fast paths unfilter
    length = len(png) - 57
    bomb = zlib.compress(bytes(60_000), 9)  # 60 kB of zeros in a stream of ~100 bytes
    return {
        "bad IDAT CRC": good[:-20] + bytes([good[-20] ^ 1]) + good[-19:],
        "bad zlib checksum": resealed(good, lambda d: d[:-1] + bytes([d[-1] ^ 1])),
        "truncated record": good[:-30],
        "truncated zlib stream": resealed(good, lambda d: d[: len(d) // 2]),
        "IDAT length one too many": good[:46] + struct.pack(">I", length + 1) + good[50:],
        "Datum length one too few": good[:7] + encode_varint(len(png) - 1) + good[9:],
        "a Sub-filtered row": record(png_of(image, filters=bytes(filtered)), 4),
        "a filter type 7": record(png_of(image, filters=b"\x07" * 28), 4),
        "inflates to one byte less": record(png_of(image, raw=b"\0" * (28 * 29 - 1)), 4),
        "inflates to one byte more": record(png_of(image, raw=b"\0" * (28 * 29 + 1)), 4),
        "a zlib bomb": resealed(good, lambda d: bomb),
        "junk after the zlib stream": resealed(good, lambda d: d + b"junk"),
        "another IHDR (27x28)": record(png_of(image_of(2, 27, 28)), 4, 27, 28),
        "another IHDR (colour)": record(png_of(np.dstack([image] * 3), colour=2), 4),
        "label 128 (a 2-byte varint)": record(png, 128),
        "label 300": record(png, 300),
        "label -1": record(png, -1),
        "encoded false": good[:-1] + b"\x00",
        "a non-minimal length varint": good[:7] + bytes((good[7], good[8] | 0x80, 0)) + good[9:],
        "shape fields in another order": b"\x10\x1c\x08\x01\x18\x1c" + good[6:],
        "an extra field at the end": good + b"\x30\x01",
        "not a PNG": record(b"GIF89a" + png[6:], 4),
    }
