"""PNG decoding for encoded Datums: zlib and numpy, checked before anything is allocated.

Caffe's data layer decodes an encoded Datum with OpenCV's ``imdecode(..., IMREAD_UNCHANGED)``
and refuses an image that is not 8-bit. This module gives the same pixels in the same
layout, ``(channels, height, width)`` uint8:

* grey: 1 channel; colour: 3, in OpenCV's BGR order; grey + alpha and colour + alpha: 4
  (B, G, R, A; grey copied into B, G and R), as OpenCV gives them;
* 8-bit grey, colour and their alpha forms, not interlaced, rows filtered with None, Sub
  or Up (what mnist2db, and most PNG writers on small images, write): decoded here;
* everything else Caffe accepts (palette, 1/2/4-bit grey, Adam7 interlacing, rows filtered
  with Average or Paeth) is checked here in the same way, then decoded by Pillow (palette:
  3 channels, 4 when it has a ``tRNS`` chunk, as OpenCV; colour with a ``tRNS`` chunk: 4);
* 16-bit images are refused, as Caffe's data layer refuses them ("Image data type must be
  unsigned byte").

Nothing in a record is trusted: every chunk's length and CRC-32 is checked, the header's
fields are checked against the PNG specification, and the declared size against what the
compressed data can possibly hold (deflate expands at most 1032:1) before any pixel
memory exists; then the image data is inflated to at most the declared size. Every
failure is one :class:`~mnist2db.errors.DatumError` naming the record.

Batches decode on a few threads (:mod:`mnist2db.reading.threaded`): zlib releases the GIL
while it inflates. The records mnist2db writes are read faster still, without protobuf,
by :mod:`mnist2db.reading.png_datums`.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.formats.imdecode.image_file import MAX_PIXELS
from mnist2db.formats.png.deflate import INFLATE_RATIO
from mnist2db.formats.png.encoder import IEND_CHUNK, PNG_SIGNATURE

if TYPE_CHECKING:
    from PIL import Image


#: No zlib stream of N bytes inflates to more than ``INFLATE_RATIO * N + INFLATE_SLACK``
#: bytes (deflate's largest expansion, :data:`~mnist2db.formats.png.deflate.INFLATE_RATIO`).
INFLATE_SLACK = 1024
#: Inflate in one call when even the worst case fits in this many bytes; above it, inflate
#: with ``max_length`` (a decompressobj costs ~1 µs more per image, so small ones skip it).
ONE_SHOT = 4 << 20

#: colour type -> (channels, allowed bit depths) (PNG specification, table 11.1)
_COLOUR_TYPES = {
    0: (1, (1, 2, 4, 8, 16)),
    2: (3, (8, 16)),
    3: (1, (1, 2, 4, 8)),
    4: (2, (8, 16)),
    6: (4, (8, 16)),
}
_COLOUR_NAMES = {0: "grey", 2: "colour", 3: "palette", 4: "grey+alpha", 6: "colour+alpha"}

_ndarray = np.ndarray
_uint8 = np.dtype(np.uint8)
_crc32 = zlib.crc32
_from_bytes = int.from_bytes


class PngHeader(NamedTuple):
    """A PNG's IHDR chunk, checked (:func:`parse_header`), and what decoding it needs."""

    width: int
    height: int
    depth: int
    colour: int
    interlaced: bool
    channels: int
    row_bytes: int  # without the filter byte
    raw_size: int  # the inflated image data: every row and its filter byte
    fast: bool  # decoded here (8-bit, not interlaced, not a palette)
    shape: tuple[int, int, int]  # of a grey image's array
    strides: tuple[int, int, int]  # of a grey image's unfiltered rows in the inflated data


#: IHDR chunks seen (length, type, body and CRC: 25 bytes) -> their parsed header; a
#: database's records share one or a few, so each is checked once. Bounded.
_HEADERS: dict[bytes, PngHeader] = {}
HEADERS_MAX = 256


def parse_header(chunk: bytes, where: str) -> PngHeader:
    """The header in ``chunk``, a PNG's first 25 bytes after its signature (the IHDR chunk:
    length, type, body, CRC), checked against the PNG specification and Caffe's limits.

    Raises:
        DatumError: naming ``where`` and what is wrong.
    """
    if chunk[:8] != b"\x00\x00\x00\x0dIHDR":
        raise DatumError(f"{where}: PNG does not begin with a 13-byte IHDR chunk")
    if _crc32(chunk[4:21]) != _from_bytes(chunk[21:25], "big"):
        raise DatumError(f"{where}: PNG IHDR chunk fails its CRC check")
    width, height = _from_bytes(chunk[8:12], "big"), _from_bytes(chunk[12:16], "big")
    depth, colour, compression, filtering, interlace = chunk[16:21]
    if width == 0 or height == 0:
        raise DatumError(f"{where}: PNG image is {width}x{height}: a side of 0 pixels")
    if width >= 1 << 31 or height >= 1 << 31:
        raise DatumError(f"{where}: PNG image is {width}x{height}: a side above 2^31-1")
    if colour not in _COLOUR_TYPES:
        raise DatumError(f"{where}: PNG colour type {colour} does not exist (0, 2, 3, 4, 6)")
    channels, depths = _COLOUR_TYPES[colour]
    if depth not in depths:
        raise DatumError(
            f"{where}: PNG bit depth {depth} is not allowed for {_COLOUR_NAMES[colour]} "
            f"images ({', '.join(map(str, depths))})"
        )
    if depth == 16:
        raise DatumError(
            f"{where}: 16-bit PNG: Caffe's data layer takes 8-bit images only "
            "('Image data type must be unsigned byte')"
        )
    if compression != 0 or filtering != 0 or interlace > 1:
        raise DatumError(
            f"{where}: PNG compression {compression}, filter method {filtering}, interlace "
            f"{interlace}: only 0, 0 and 0 or 1 exist"
        )
    if width * height > MAX_PIXELS:
        raise DatumError(
            f"{where}: PNG image is {width}x{height}: more than the {MAX_PIXELS} pixels "
            "OpenCV decodes"
        )
    bits = channels * depth
    row_bytes = (width * bits + 7) // 8
    if interlace:
        raw_size = 0
        # Adam7: each pass is a smaller image (x0, y0, dx, dy), every row with a filter byte.
        for x0, y0, dx, dy in _ADAM7:
            pass_width, pass_height = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
            if pass_width and pass_height:
                raw_size += pass_height * ((pass_width * bits + 7) // 8 + 1)
    else:
        raw_size = height * (row_bytes + 1)
    return PngHeader(
        width,
        height,
        depth,
        colour,
        bool(interlace),
        channels,
        row_bytes,
        raw_size,
        depth == 8 and not interlace and colour != 3,
        (1, height, width),
        (0, row_bytes + 1, 1),
    )


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))  # fmt: skip


def decode_png(data: bytes, where: str) -> np.ndarray:
    """A PNG's pixels as Caffe's data layer sees them: a fresh, writable ``(c, h, w)`` uint8
    array (see the module's docstring for channels and order).

    Raises:
        DatumError: the data is not a PNG, breaks the format anywhere, is 16-bit, or
            claims more pixels than it holds; the message begins with ``where``.
    """
    head = data[8:33]
    header = _HEADERS.get(head)
    if header is None or data[:8] != PNG_SIGNATURE:
        if data[:8] != PNG_SIGNATURE:
            raise DatumError(f"{where}: not a PNG (no PNG signature)")
        header = parse_header(head, where)
        if len(_HEADERS) >= HEADERS_MAX:
            _HEADERS.clear()
        _HEADERS[head] = header
    # The common layout, as mnist2db writes it: IHDR, one IDAT, IEND. Checked by slices;
    # any other goes through the chunk walk, which checks the same and more.
    length = _from_bytes(data[33:37], "big")
    end = 41 + length
    tables = 0
    if (
        data[37:41] == _IDAT
        and data[end + 4 :] == IEND_CHUNK
        and _crc32(data[37:end]) == _from_bytes(data[end : end + 4], "big")
    ):
        compressed: bytes | memoryview = data[41:end]
    else:
        compressed, tables = _walk(data, where)
        length = len(compressed)
    if header.raw_size > INFLATE_RATIO * length + INFLATE_SLACK:
        raise DatumError(
            f"{where}: PNG header claims {header.width}x{header.height} pixels "
            f"({header.raw_size} bytes of image data), but its {length} bytes of "
            "compressed data cannot hold that many"
        )
    if INFLATE_RATIO * length + INFLATE_SLACK <= ONE_SHOT:
        try:
            raw = zlib.decompress(compressed)
        except zlib.error as exc:
            raise DatumError(f"{where}: PNG image data does not inflate: {exc}") from None
        if len(raw) < header.raw_size:
            raise DatumError(
                f"{where}: PNG image data holds {len(raw)} bytes, its header needs "
                f"{header.raw_size} (truncated)"
            )
    else:
        raw = _inflate(compressed, header.raw_size, where)
    if header.fast and not (tables and header.colour == 2):
        stride = header.row_bytes + 1
        if raw[0 : header.raw_size : stride].count(0) == header.height:
            if header.colour == 0:  # grey, no row filtered: the rows as they are
                return _ndarray(header.shape, _uint8, raw, 1, header.strides).copy()
            rows: np.ndarray | None = _ndarray(
                (header.height, header.row_bytes), _uint8, raw, 1, (stride, 1)
            )
        else:
            rows = _unfilter(raw, header, where)
        if rows is not None:
            return _arrange(rows, header)
    if header.colour == 3 and not tables & _PLTE:
        raise DatumError(f"{where}: palette PNG without a PLTE chunk")
    if header.width * header.height > _pillow_limit():
        raise DatumError(
            f"{where}: PNG image is {header.width}x{header.height}: more pixels than Pillow, "
            "which decodes this kind of PNG (palette, below 8 bits, interlaced, Average or "
            "Paeth filters, colour with tRNS), takes"
        )
    return _decode_with_pillow(data, where)


_PLTE, _TRNS = 1, 2
_IDAT, _IEND = b"IDAT", b"IEND"


def _walk(data: bytes, where: str) -> tuple[bytes | memoryview, int]:
    """The concatenated IDAT data, and which of PLTE/tRNS the PNG has; every chunk after
    IHDR checked: its length within the data, its CRC, one run of IDATs, an IEND."""
    view = memoryview(data)
    size = len(data)
    pos = 33
    parts: list[memoryview] = []
    tables = 0
    ended_idat = False
    while True:
        if pos + 12 > size:
            raise DatumError(
                f"{where}: PNG is truncated at byte {size}"
                + (" (no IEND chunk)" if parts else " (no IDAT chunk)")
            )
        length = _from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        name = kind.decode("ascii", "backslashreplace")
        end = pos + 8 + length
        if length >= 1 << 31 or end + 4 > size:
            raise DatumError(
                f"{where}: PNG chunk {name} at byte {pos} claims {length} bytes, "
                f"{max(0, size - pos - 12)} are left"
            )
        if _crc32(view[pos + 4 : end]) != _from_bytes(data[end : end + 4], "big"):
            raise DatumError(f"{where}: PNG chunk {name} at byte {pos} fails its CRC check")
        if kind == _IDAT:
            if ended_idat:
                raise DatumError(f"{where}: PNG IDAT chunks are not consecutive")
            parts.append(view[pos + 8 : end])
        else:
            if parts:
                ended_idat = True
            if kind == _IEND:
                break
            if kind == b"PLTE":
                tables |= _PLTE
            elif kind == b"tRNS":
                tables |= _TRNS
            elif kind == b"IHDR":
                raise DatumError(f"{where}: PNG has a second IHDR chunk at byte {pos}")
        pos = end + 4
    if not parts:
        raise DatumError(f"{where}: PNG has no IDAT chunk")
    return (parts[0] if len(parts) == 1 else b"".join(parts)), tables


def _inflate(compressed: bytes | memoryview, raw_size: int, where: str) -> bytes:
    """The first ``raw_size`` inflated bytes: never more memory than that (plus zlib's
    own), an error if the stream is damaged or holds fewer. (Small streams, whose worst
    case is small, are inflated in one call by :func:`decode_png` itself.)"""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(compressed, raw_size)
        if len(raw) == raw_size and not inflater.eof and not inflater.unconsumed_tail:
            raw += inflater.flush()  # the checksum, so a damaged one is still seen
    except zlib.error as exc:
        raise DatumError(f"{where}: PNG image data does not inflate: {exc}") from None
    if len(raw) < raw_size:
        raise DatumError(
            f"{where}: PNG image data holds {len(raw)} bytes, its header needs {raw_size} "
            "(truncated)"
        )
    return raw


def _unfilter(raw: bytes, header: PngHeader, where: str) -> np.ndarray | None:
    """The rows without their filter bytes, unfiltered: ``(height, row_bytes)`` uint8; None
    when a row uses Average or Paeth (Pillow decodes those)."""
    height, row_bytes = header.height, header.row_bytes
    stride = row_bytes + 1
    filters = raw[0 : height * stride : stride]
    if max(filters) > 2:
        if max(filters) > 4:
            row = next(r for r, f in enumerate(filters) if f > 4)
            raise DatumError(
                f"{where}: PNG row {row}: filter type {filters[row]} does not exist (0-4)"
            )
        return None
    rows = np.frombuffer(raw, _uint8, height * stride).reshape(height, stride)[:, 1:].copy()
    bpp = header.channels
    row = 0
    while row < height:
        kind = filters[row]
        run = row + 1
        while run < height and filters[run] == kind:
            run += 1
        if kind == 1:  # Sub: each byte adds the byte one pixel to its left, row by row
            block = rows[row:run].reshape(run - row, header.width, bpp)
            np.cumsum(block, axis=1, dtype=_uint8, out=block)
        elif kind == 2:  # Up: each byte adds the byte above it (above the first row: 0)
            block = rows[max(0, row - 1) : run]
            np.cumsum(block, axis=0, dtype=_uint8, out=block)
        row = run
    return rows


def _arrange(rows: np.ndarray, header: PngHeader) -> np.ndarray:
    """Unfiltered rows as a fresh ``(c, h, w)`` array in OpenCV's channel order."""
    height, width, colour = header.height, header.width, header.colour
    if colour == 0:
        return rows.reshape(1, height, width).copy()
    pixels = rows.reshape(height, width, header.channels)
    if colour == 2:
        return np.ascontiguousarray(pixels[:, :, ::-1].transpose(2, 0, 1))
    if colour == 6:
        return np.ascontiguousarray(pixels[:, :, [2, 1, 0, 3]].transpose(2, 0, 1))
    return np.ascontiguousarray(pixels[:, :, [0, 0, 0, 1]].transpose(2, 0, 1))  # grey+alpha


# -- Pillow: every other image ----------------------------------------------------------


def decode_datum_image(data: bytes, where: str) -> np.ndarray:
    """An encoded Datum's image as Caffe's data layer decodes it: PNG by
    :func:`decode_png`, anything else (JPEG, ...) by Pillow; ``(c, h, w)`` uint8.

    Raises:
        DatumError: the data cannot be decoded, or is not 8-bit; naming ``where``.
    """
    if data[:8] == PNG_SIGNATURE:
        return decode_png(data, where)
    return _decode_with_pillow(data, where)


def decoded_datum(datum: Any, where: str) -> Any:
    """``datum`` with an encoded image replaced by its raw pixels (``encoded`` false, the
    decoded shape); a raw Datum is returned as it is. Changes ``datum`` in place.

    Raises:
        DatumError: the image cannot be decoded.
    """
    if datum.encoded:
        image = decode_datum_image(datum.data, where)
        datum.channels, datum.height, datum.width = (int(d) for d in image.shape)
        datum.data = image.tobytes()
        datum.encoded = False
    return datum


def _pillow_limit() -> int:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return MAX_PIXELS if limit is None else min(MAX_PIXELS, int(limit))


#: Pillow's modes of more than 8 bits a channel: Caffe's data layer refuses such images.
_WIDE_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N", "I;16S", "I;32", "RGB;16", "RGBA;16")


def _decode_with_pillow(data: bytes, where: str) -> np.ndarray:
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.mode in _WIDE_MODES or opened.mode.startswith("I;"):
                raise DatumError(
                    f"{where}: {opened.format} image of mode {opened.mode}: Caffe's data layer "
                    "takes 8-bit images only ('Image data type must be unsigned byte')"
                )
            opened.load()
            return _caffe_layout(opened)
    except DatumError:
        raise
    except UnidentifiedImageError:
        raise DatumError(
            f"{where}: encoded image cannot be decoded: not a PNG, nor an image Pillow "
            f"identifies ({len(data)} bytes, beginning {bytes(data[:8])!r})"
        ) from None
    except Exception as exc:  # Pillow raises many kinds (OSError, SyntaxError, ValueError...)
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise DatumError(f"{where}: encoded image cannot be decoded: {text}") from None


def _caffe_layout(image: Image.Image) -> np.ndarray:
    """A Pillow image as OpenCV's ``IMREAD_UNCHANGED`` gives it, ``(c, h, w)``: grey 1
    channel, colour 3 (BGR); with alpha, a palette's or a colour image's ``tRNS``: 4 (BGRA)."""
    mode = image.mode
    transparent = "transparency" in image.info
    if mode == "1":
        image = image.convert("L")
    elif mode == "P" or (mode == "RGB" and transparent):
        image = image.convert("RGBA" if transparent else "RGB")
    elif mode in ("LA", "La", "PA"):
        image = image.convert("RGBA")
    elif mode not in ("L", "RGB", "RGBA"):
        image = image.convert("RGB")
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        return pixels[np.newaxis].copy()
    order = [2, 1, 0] if pixels.shape[2] == 3 else [2, 1, 0, 3]
    return np.ascontiguousarray(pixels[:, :, order].transpose(2, 0, 1))
