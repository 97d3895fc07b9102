"""A hostile JPEG corpus, generated: base JPEGs of every layout a decoder treats its own way
(baseline and progressive, 4:2:0, 4:2:2 and 4:4:4, grey, CMYK, Adobe RGB, restart markers,
EXIF orientations) and the ways each is damaged (cut at many offsets, bits flipped in the
headers and the scan data, markers made, removed or doubled, frame sizes changed), all
from fixed seeds: the same corpus on every run.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator

import numpy as np
from PIL import Image

#: JPEG markers without a length: TEM, RST0-7, SOI, EOI.
_BARE = frozenset((0x01, *range(0xD0, 0xDA)))


def smooth_pixels(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Smooth content with noise (what photographs hold, unlike pure noise), uint8."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(1, height // 6), max(1, width // 6), channels), np.uint8)
    image = Image.fromarray(
        base[:, :, 0] if channels == 1 else base, "CMYK" if channels == 4 else None
    )
    pixels = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR)).astype(int)
    noise = rng.integers(-12, 13, pixels.shape)
    return np.clip(pixels + noise, 0, 255).astype(np.uint8)


def jpeg_bytes(pixels: np.ndarray, mode: str | None = None, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, "JPEG", **options)
    return out.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def base_jpegs() -> dict[str, bytes]:
    """The undamaged JPEGs, by name: every side at least 8 (an eighth of it is a pixel)."""
    colour = smooth_pixels(37, 45, 3, 1)
    wide = smooth_pixels(29, 203, 3, 2)
    grey = smooth_pixels(33, 26, 1, 3)
    cmyk = smooth_pixels(24, 19, 4, 4)
    return {
        "baseline-420": jpeg_bytes(colour, quality=85, subsampling=2),
        "baseline-422": jpeg_bytes(colour, quality=90, subsampling=1),
        "baseline-444": jpeg_bytes(colour, quality=75, subsampling=0),
        "baseline-wide-optimized": jpeg_bytes(wide, quality=80, optimize=True),
        "progressive-420": jpeg_bytes(colour, quality=85, progressive=True),
        "progressive-444": jpeg_bytes(colour, quality=95, subsampling=0, progressive=True),
        "restarts-every-2-blocks": jpeg_bytes(colour, quality=85, restart_marker_blocks=2),
        "restarts-progressive-rows": jpeg_bytes(
            wide, quality=85, progressive=True, restart_marker_rows=1
        ),
        "grey": jpeg_bytes(grey, quality=85),
        "grey-progressive": jpeg_bytes(grey, quality=70, progressive=True),
        "cmyk": jpeg_bytes(cmyk, "CMYK", quality=85),
        "adobe-rgb": jpeg_bytes(colour, quality=85, keep_rgb=True, subsampling=0),
        "exif-orientation-6": jpeg_bytes(colour, quality=85, exif=_exif(6)),
        "exif-orientation-3-progressive": jpeg_bytes(
            colour, quality=85, progressive=True, exif=_exif(3)
        ),
    }


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """``(marker, start, end)`` of each marker segment up to the first scan's header (its
    end the start of the entropy-coded data), walked as libjpeg walks them."""
    found, position = [], 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker in _BARE:
            found.append((marker, position, position + 2))
            position += 2
            continue
        (length,) = struct.unpack(">H", data[position + 2 : position + 4])
        found.append((marker, position, position + 2 + length))
        position += 2 + length
        if marker == 0xDA:
            break
    return found


def _set(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def damaged(data: bytes) -> Iterator[tuple[str, bytes]]:
    """``(what was done, the bytes)`` for each way ``data`` (one JPEG) is damaged."""
    heads = segments(data)
    scan = heads[-1][2] if heads and heads[-1][0] == 0xDA else 2
    end = len(data)
    # Cut: at each segment's edges, every 5th offset through the headers and the scan's
    # first bytes, every 29th after, and each of the last 24 (the last blocks, the EOI).
    edges = {at + step for _, start, stop in heads for at in (start, stop) for step in (-1, 0, 1)}
    cuts = {
        *range(0, 24),
        *edges,
        *range(0, scan + 16, 5),
        *range(scan, end, 29),
        *range(max(0, end - 24), end),
    }
    for cut in sorted(at for at in cuts if 0 <= at < end):
        yield f"cut at {cut}", data[:cut]
    # One bit flipped: every 3rd header byte (its bit chosen by its offset), then the scan.
    for at in range(2, scan, 3):
        yield f"bit {at % 8} of {at} flipped", _set(data, at, bytes([data[at] ^ 1 << at % 8]))
    for at in range(scan, end, 11):
        bit = (at * 3) % 8
        yield f"bit {bit} of {at} flipped", _set(data, at, bytes([data[at] ^ 1 << bit]))
    # Bytes of the scan made a marker, a stuffed zero, or a restart marker.
    for at in range(scan, end - 2, 37):
        yield f"0xff at {at}", _set(data, at, b"\xff")
        yield f"ff d{at % 8} at {at}", _set(data, at, bytes([0xFF, 0xD0 + at % 8]))
        yield f"ff d9 (EOI) at {at}", _set(data, at, b"\xff\xd9")
        yield f"0x00 at {at}", _set(data, at, b"\x00")
    yield from _damaged_segments(data, heads)
    yield "EOI removed", data[:-2] if data.endswith(b"\xff\xd9") else data + b"\x00"
    yield "bytes after EOI", data + b"\x00\x01garbage\xff"
    yield "EOI twice", data + b"\xff\xd9"
    yield "a second image after EOI", data + data
    yield "SOI twice", data[:2] + data
    yield "junk between segments", data[:2] + b"\x00\x13" + data[2:]
    yield "restart markers removed", _without_restarts(data, scan)


def _damaged_segments(
    data: bytes, heads: list[tuple[int, int, int]]
) -> Iterator[tuple[str, bytes]]:
    """Damage to the marker segments: frame sizes, precision, components, sampling, tables."""
    for marker, start, stop in heads:
        name = f"{marker:02x} at {start}"
        if marker in (0xC0, 0xC1, 0xC2):
            for height, width in (
                (0, 45),
                (45, 0),
                (1, 1),
                (7, 9),
                (0xFFFF, 0xFFFF),
                (0x8000, 40),
                (40, 0x8000),
                (2000, 2000),
                (30, 46),
            ):
                yield (
                    f"frame {name} declares {width}x{height}",
                    _set(data, start + 5, struct.pack(">HH", height, width)),
                )
            for precision in (0, 7, 12, 16):
                yield (
                    f"frame {name} precision {precision}",
                    _set(data, start + 4, bytes([precision])),
                )
            count = data[start + 9]
            for other in (0, 2, 4, count + 1):
                if other != count:
                    yield (
                        f"frame {name} with {other} components",
                        _set(data, start + 9, bytes([other])),
                    )
            for i in range(count):
                at = start + 10 + 3 * i
                for sampling in (0x00, 0x44, 0x13, 0x21, 0x55):
                    yield (
                        f"frame {name} component {i} sampling {sampling:02x}",
                        _set(data, at + 1, bytes([sampling])),
                    )
                yield f"frame {name} component {i} table 3", _set(data, at + 2, b"\x03")
                yield f"frame {name} component {i} id 9", _set(data, at, b"\x09")
            yield f"a second frame after {name}", data[:stop] + data[start:stop] + data[stop:]
        if marker in (0xC4, 0xDB, 0xDD, 0xE0, 0xE1, 0xFE):
            yield f"segment {name} removed", data[:start] + data[stop:]
            yield f"segment {name} doubled", data[:stop] + data[start:stop] + data[stop:]
            yield (
                f"segment {name} length +1",
                _set(data, start + 2, struct.pack(">H", stop - start - 1)),
            )
            yield (
                f"segment {name} length -1",
                _set(data, start + 2, struct.pack(">H", stop - start - 3)),
            )
        if marker == 0xDA:
            yield f"scan header {name} selector 9", _set(data, start + 5, b"\x09")
            yield f"scan header {name} tables ff", _set(data, start + 6, b"\xff")
            yield f"scan header {name} spectral end 70", _set(data, stop - 2, b"\x46")
    yield (
        "a restart interval of 1 before the scan",
        data[:2] + b"\xff\xdd\x00\x04\x00\x01" + data[2:],
    )
    yield (
        "a restart interval of 0 before the scan",
        data[:2] + b"\xff\xdd\x00\x04\x00\x00" + data[2:],
    )


def _without_restarts(data: bytes, scan: int) -> bytes:
    out, at = bytearray(data[:scan]), scan
    while at < len(data):
        if data[at] == 0xFF and at + 1 < len(data) and 0xD0 <= data[at + 1] <= 0xD7:
            at += 2
            continue
        out.append(data[at])
        at += 1
    return bytes(out)


def hostile_corpus() -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of every base JPEG, undamaged and damaged every way."""
    for base, data in base_jpegs().items():
        yield base, data
        for what, bad in damaged(data):
            yield f"{base}: {what}", bad
