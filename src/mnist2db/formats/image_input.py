"""An input image file read as OpenCV's ``imread`` takes it, within its limits, and safely.

``imread`` finds the decoder from the file's first bytes (``findDecoder``), reads the
header, and refuses a size past ``CV_IO_MAX_IMAGE_WIDTH`` or ``CV_IO_MAX_IMAGE_HEIGHT``
(2^20) or ``CV_IO_MAX_IMAGE_PIXELS`` (2^30) before it decodes a pixel. A listed path may
be anything, so :func:`read_image_file` does the same and more, each refusal an
:class:`~mnist2db.errors.ImageError` naming the file (the image is then skipped, as Caffe
skips what it cannot read):

* opened without blocking (a FIFO without a writer), and read only when ``fstat`` says a
  regular file: a link to ``/dev/zero``, a device, a FIFO or a directory is never read;
* at most :data:`MAX_FILE_BYTES` (protobuf's 2 GiB, what a record can hold): a huge
  sparse file is refused from its size;
* the signature first: a large file that is no image OpenCV reads is refused after its
  first bytes;
* the width and height its header declares (:func:`declared_size`) within OpenCV's
  limits, before any decoder allocates for them.

:func:`check_resize` refuses up front a resize to what no record can hold, and
:func:`check_fits_a_record` an image whose pixels no record can hold.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import warnings

from mnist2db.errors import ArgumentError, ImageError, printable
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.png import PNG_SIGNATURE

if TYPE_CHECKING:
    from typing import Any, NoReturn

#: OpenCV's ``CV_IO_MAX_IMAGE_WIDTH`` and ``CV_IO_MAX_IMAGE_HEIGHT``.
MAX_SIDE = 1 << 20
#: OpenCV's ``CV_IO_MAX_IMAGE_PIXELS``.
MAX_PIXELS = 1 << 30
#: The largest file read as an image: protobuf's limit on a message (a record), 2 GiB.
MAX_FILE_BYTES = (1 << 31) - 1
#: Bytes read before the signature says whether the rest is worth reading.
_HEAD = 1 << 16
#: A record's bytes besides its pixels: the Datum's fields (at most a few dozen bytes).
_RECORD_FIELDS = 64

#: JPEG's start-of-frame markers (the frame header holds the size): C0-CF but DHT, JPG, DAC.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers without a length: TEM, RST0-7, SOI, EOI.
_JPEG_BARE = frozenset((0x01, *range(0xD0, 0xDA)))


def image_format(data: bytes) -> str | None:
    """The format of encoded image bytes from their signature (``"PNG"``, ``"JPEG"``, ...),
    as OpenCV's decoders' ``checkSignature``; None: no format OpenCV reads."""
    head = bytes(data[:12])
    if head.startswith(PNG_SIGNATURE):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"BM"):
        return "BMP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if len(head) >= 2 and head[0:1] == b"P" and head[1:2] in b"123456":
        return "PPM"
    return None


def read_image_file(path: str | bytes) -> bytes:
    """The bytes of the image file at ``path``, once it is known to be a regular file of at
    most :data:`MAX_FILE_BYTES`, of a format OpenCV reads, declaring a size OpenCV accepts.

    Raises:
        ImageError: any of these does not hold, or the file cannot be read (naming it).
    """
    # On the descriptor itself (a file object costs more than reading a small image):
    # opened non-blocking (a FIFO cannot hang it), checked with fstat, then read.
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise ImageError(f"{_shown(path)}: cannot read it: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            fd = -1
            _refuse_irregular(path)
        size = info.st_size
        if size > MAX_FILE_BYTES:
            raise ImageError(
                f"{_shown(path)}: {size} bytes; an image file is read up to {MAX_FILE_BYTES} "
                "bytes (protobuf's 2 GiB, what a record holds)"
            )
        # Small files in one read; a large one's signature first.
        asked = size + 1 if size < _HEAD else _HEAD
        data = _read(fd, asked)
        kind = image_format(data)
        if kind is None:
            raise ImageError(
                f"{_shown(path)}: not an image OpenCV reads (PNG, JPEG, BMP, PPM, TIFF, WebP)"
            )
        if len(data) == asked:
            data += _read(fd, size + 1 - len(data))
        if len(data) > size:
            raise ImageError(f"{_shown(path)}: grew while it was read (from {size} bytes)")
    except OSError as exc:
        raise ImageError(f"{_shown(path)}: cannot read it: {exc.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    check_declared_size(data, kind, _shown(path))
    return data


def _refuse_irregular(path: str | bytes) -> NoReturn:
    """Refuse a listed path that is not a regular file, saying what it is (a FIFO, a
    directory, ...: the untrusted-file check's words, loaded only for such a path).

    Raises:
        ImageError: always.
    """
    from mnist2db.fetch.untrusted import NotRegularFile, open_regular

    try:
        with open_regular(os.fsdecode(path)):
            pass
    except NotRegularFile as exc:
        raise ImageError(f"{_shown(path)}: {exc.strerror}: only an image file is read") from None
    except OSError as exc:
        raise ImageError(f"{_shown(path)}: cannot read it: {exc.strerror}") from None
    raise ImageError(f"{_shown(path)}: changed while it was read")


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _read(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes, fewer only at the end of the file (one read may return less)."""
    data = os.read(fd, size)
    if len(data) == size or not data:
        return data
    parts = [data]
    while size > len(data):
        more = os.read(fd, size - len(data))
        if not more:
            break
        parts.append(more)
        data = b"".join(parts)  # rare: a file past Linux's 2 GiB read
    return data


def _shown(path: str | bytes) -> str:
    return printable(os.fsdecode(path))


def check_declared_size(data: bytes, kind: str | None, where: str) -> None:
    """Refuse an image whose header declares a size OpenCV's ``imread`` refuses (more than
    2^20 a side or 2^30 pixels, or none), before anything is decoded.

    Raises:
        ImageError: naming ``where`` and the size.
    """
    size = declared_size(data, kind)
    if size is None:
        return  # no header to read: the decoder refuses it
    width, height = size
    if 0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE and width * height <= MAX_PIXELS:
        return
    raise ImageError(
        f"{where}: its header declares {width} × {height} pixels; OpenCV reads at most "
        f"{MAX_SIDE} a side and {MAX_PIXELS} pixels (CV_IO_MAX_IMAGE_PIXELS)"
    )


def check_fits_a_record(data: bytes, channels: int, where: str) -> None:
    """Refuse, before it is decoded, an image whose raw record (``channels`` × height ×
    width bytes, not resized) would be more than protobuf's 2 GiB: no reader parses it.

    Raises:
        ImageError: naming ``where`` and the size (a resize makes it a record).
    """
    size = declared_size(data, image_format(data))
    if size is None:
        return
    width, height = size
    if channels * width * height + _RECORD_FIELDS > MAX_FILE_BYTES:
        raise ImageError(
            f"{where}: {channels} × {height} × {width} is {channels * width * height} bytes, "
            "more than a record holds (protobuf's 2 GiB); give a resize"
        )


def declared_size(data: bytes, kind: str | None) -> tuple[int, int] | None:
    """``(width, height)`` as the header of ``data`` (an image of ``kind``) declares them;
    None when the header cannot be read (damaged, cut short: the decoder then refuses it)."""
    try:
        reader = _HEADERS.get(kind or "")
        return reader(data) if reader is not None else None
    except (struct.error, IndexError, ValueError):
        return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The first frame header's size, found walking the segments as libjpeg does."""
    position = 2
    end = len(data)
    while position + 4 <= end:
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill bytes
            position += 1
            continue
        if marker in _JPEG_BARE:
            position += 2
            continue
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[position + 5 : position + 9])
            return int(width), int(height)
        if marker == 0xDA:  # scan data before any frame header
            return None
        (length,) = struct.unpack(">H", data[position + 2 : position + 4])
        position += 2 + length
    return None


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    (header,) = struct.unpack("<I", data[14:18])
    if header == 12:  # BITMAPCOREHEADER
        width, height = struct.unpack("<HH", data[18:22])
    else:
        width, height = struct.unpack("<ii", data[18:26])
    return abs(int(width)), abs(int(height))


def _pnm_size(data: bytes) -> tuple[int, int] | None:
    fields: list[bytes] = []
    for line in bytes(data[2:4096]).split(b"\n"):
        fields.extend(line.split(b"#", 1)[0].split())
        if len(fields) >= 2:
            break
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    """ImageWidth (256) and ImageLength (257) of the first directory."""
    order = "<" if data[:2] == b"II" else ">"
    (offset,) = struct.unpack(order + "I", data[4:8])
    (count,) = struct.unpack(order + "H", data[offset : offset + 2])
    found: dict[int, int] = {}
    for i in range(min(count, 4096)):
        entry = data[offset + 2 + 12 * i : offset + 14 + 12 * i]
        tag, kind = struct.unpack(order + "HH", entry[:4])
        if tag in (256, 257):
            value = entry[8:10] if kind == 3 else entry[8:12]
            found[tag] = struct.unpack(order + ("H" if kind == 3 else "I"), value)[0]
    if 256 not in found or 257 not in found:
        return None
    return found[256], found[257]


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


_HEADERS = {
    "PNG": _png_size,
    "JPEG": _jpeg_size,
    "BMP": _bmp_size,
    "PPM": _pnm_size,
    "TIFF": _tiff_size,
    "WEBP": _webp_size,
}


def open_with_pillow(data: bytes, kind: str) -> Any:
    """Pillow's image of ``data`` (checked by :func:`check_declared_size`), opened by the
    plugin of ``kind`` itself: OpenCV's limits stand in for Pillow's lower ones
    (``MAX_IMAGE_PIXELS``, a warning past 89 million pixels and an error past twice that),
    which would refuse images OpenCV reads, and would do it with a warning."""
    from PIL import Image, UnidentifiedImageError

    if kind not in Image.OPEN:
        Image.init()
    factory, _ = Image.OPEN[kind]
    try:
        return factory(io.BytesIO(data), "")
    except (SyntaxError, IndexError, TypeError, struct.error) as exc:
        # What Image.open turns into UnidentifiedImageError: a header the plugin cannot read.
        raise UnidentifiedImageError(f"cannot identify the image: {exc}") from None


def ignore_decoder_warnings() -> None:
    """For a front end's process, before its decoding threads start: the warnings Pillow
    gives about the files it reads (corrupt EXIF, a TIFF tag past the end of the file, ...)
    ignored, as OpenCV ignores them: the image decodes as it would without them, and the
    front end's lines stay one a line (Caffe's log, one error). A library caller's own
    filters stand; one that makes them errors gets the image refused in one line."""
    warnings.filterwarnings("ignore", module=r"PIL\.")


def check_resize(resize: tuple[int, int] | None, channels: int) -> None:
    """Refuse, before any image is read, a resize to ``(width, height)`` whose record of
    ``channels`` × height × width bytes is more than protobuf's 2 GiB (no record holds it;
    numpy would allocate it for every image first).

    Raises:
        ArgumentError: a side below 1, or a record too large, in one line.
    """
    if resize is None:
        return
    width, height = resize
    if min(resize) < 1:
        raise ArgumentError(f"cannot resize to {width} × {height}: both must be ≥ 1")
    size = channels * width * height
    if size + _RECORD_FIELDS > MAX_FILE_BYTES:
        raise ArgumentError(
            f"cannot resize to {width} × {height}: an image of {channels} × {height} × "
            f"{width} is {size} bytes, more than a record holds (protobuf's 2 GiB)"
        )
