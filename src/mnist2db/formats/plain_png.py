"""The commonest image of a list, a plain PNG, read straight into its raw record: no numpy.

A plain PNG is 8-bit grey or RGB, not interlaced, with no chunk beside IHDR and IDAT that
changes what OpenCV reads of it (:data:`INERT_CHUNKS`: text, time, ...; no gamma, colour
profile or EXIF), and the CRCs of both right. OpenCV's ``imread`` of one is its samples as
stored (``IMREAD_COLOR``: grey in all three channels, RGB as BGR; ``IMREAD_GRAYSCALE`` of a
grey one: the samples), so Caffe's record is those samples, plane after plane, whatever
decoder inflates them: here Pillow's own zlib decoder, without its Python chunk reader
(:func:`plain_samples`). MNIST-size images are read thousands a second a core, so
:func:`plain_record` goes from the path to the record in one function: the file read
through its descriptor, the grey samples inflated into a buffer kept for the next image
of the size by Pillow's core (``PIL._imaging``) alone (Pillow's ``Image`` and ``tobytes``
cost more than the inflate itself; its ``Image`` module alone takes each worker ~19 ms of
CPU to import).

Anything else gives None (another kind of PNG, grey wanted of a colour one, a file that is
not regular or over :data:`FAST_BYTES`, a CRC that does not match, data cut short):
:mod:`mnist2db.formats.image` then reads it, and says why it cannot.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
import zlib

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.datum import datum_prefix
from mnist2db.formats.png import IEND_CHUNK, PNG_SIGNATURE
from mnist2db.formats.protowire import encode_varint

if TYPE_CHECKING:
    from typing import Any

#: Chunks that change nothing OpenCV reads from an 8-bit grey or RGB PNG.
INERT_CHUNKS = frozenset((b"tEXt", b"zTXt", b"iTXt", b"tIME", b"pHYs", b"bKGD", b"sBIT",
                          b"tRNS", b"hIST", b"sPLT", b"cHRM"))  # fmt: skip
#: The largest file :func:`plain_record` reads (larger ones take the full path, whose
#: decode, not its reading, is then the cost).
FAST_BYTES = 1 << 24
#: OpenCV's ``CV_IO_MAX_IMAGE_WIDTH`` / ``HEIGHT`` (the full path's check, kept here).
_MAX_SIDE = 1 << 20
_MAX_PIXELS = 1 << 24  # a plain PNG's pixels at most (and so within every record limit)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_IHDR_LENGTH = b"\x00\x00\x00\x0d"
_IDAT = b"IDAT"
_crc32 = zlib.crc32
_from_bytes = int.from_bytes

#: Pillow's ``Image`` module and its core, each loaded by the first call that needs it (a
#: worker, not the parent that forks it: a grey image needs the core alone); whether
#: Pillow maps a buffer (False: it copied one); and each thread's buffers kept for the
#: next grey image of a size (Pillow's decoder runs without the GIL: a buffer is never
#: shared by two threads).
_pillow: list[Any] = []
_pillow_core: list[Any] = []
_maps: list[bool] = []
_kept = threading.local()
_KEPT_SIZES = 16
_prefixes: dict[tuple[int, int, int], bytes] = {}
_tails: dict[int, bytes] = {}


def plain_record(path: bytes, color: bool, label: int) -> tuple[bytes, tuple[int, int, int]] | None:
    """The raw Datum ``ReadImageToDatum`` writes of the plain PNG at ``path`` (read in
    colour, ``IMREAD_COLOR``, or grey), and its ``(channels, height, width)``; None when it
    is not a plain PNG (or not a regular file, or anything unusual): the full path decides."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        size = info.st_size
        if not stat.S_ISREG(info.st_mode) or size > FAST_BYTES:
            return None
        data = os.read(fd, size + 1)  # a regular file: fewer bytes only at its end
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != size or data[:8] != PNG_SIGNATURE:
        return None
    found = _plain_chunks(data)
    if found is None:
        return None
    grey, width, height, compressed = found
    if width > _MAX_SIDE or height > _MAX_SIDE:
        return None  # OpenCV's imread refuses it: the full path says so
    if grey:
        pixels: bytes | bytearray | None = _inflate_grey(compressed, width, height)
    elif color:
        pixels = _inflate(compressed, "RGB", width, height)
    else:
        return None  # grey of a colour PNG: libpng's weights, the full path's
    if pixels is None:
        return None
    channels = 3 if color else 1
    shape = (channels, height, width)
    prefix = _prefixes.get(shape)
    if prefix is None:
        if len(_prefixes) >= _KEPT_SIZES:
            _prefixes.clear()
        prefix = datum_prefix(channels, height, width, channels * width * height)
        _prefixes[shape] = prefix
    tail = _tails.get(label)
    if tail is None:
        tail = b"\x28" + encode_varint(label) + b"\x38\x00"
        if 0 <= label < 1024:
            _tails[label] = tail
    parts: tuple[bytes | bytearray, ...]
    if not grey:  # RGB samples to B, G, R planes
        parts = (prefix, pixels[2::3], pixels[1::3], pixels[0::3], tail)
    elif color:
        parts = (prefix, pixels, pixels, pixels, tail)
    else:
        parts = (prefix, pixels, tail)
    return b"".join(parts), shape


def plain_samples(data: bytes) -> tuple[str, int, int, bytes] | None:
    """The samples of a plain PNG's bytes (its signature already seen): ``(mode, width,
    height, bytes)``, ``mode`` Pillow's ``"L"`` or ``"RGB"``; None for any other PNG, or
    anything unusual."""
    found = _plain_chunks(data)
    if found is None:
        return None
    grey, width, height, compressed = found
    if grey:
        kept = _inflate_grey(compressed, width, height)
        return None if kept is None else ("L", width, height, bytes(kept))
    samples = _inflate(compressed, "RGB", width, height)
    return None if samples is None else ("RGB", width, height, samples)


def _plain_chunks(data: bytes) -> tuple[bool, int, int, bytes] | None:
    """Whether a plain PNG is grey, its width and height, and its image data; None when it
    is not plain. The usual layout (IHDR, one IDAT, IEND) is checked by slices; any other
    is walked chunk by chunk (:func:`_walk`), which checks the same and more."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    if depth != 8 or colour not in (0, 2) or interlace or not 0 < width * height <= _MAX_PIXELS:
        return None
    length = _from_bytes(data[33:37], "big")
    end = 41 + length
    if (
        data[8:12] == _IHDR_LENGTH
        and data[37:41] == _IDAT
        and data[end + 4 :] == IEND_CHUNK
        and _crc32(data[12:29]) == _from_bytes(data[29:33], "big")
        and _crc32(data[37:end]) == _from_bytes(data[end : end + 4], "big")
    ):
        return colour == 0, width, height, data[41:end]
    compressed = _walk(data)
    return None if compressed is None else (colour == 0, width, height, compressed)


def _walk(data: bytes) -> bytes | None:
    """The image data of a PNG's chunks: IHDR's and the IDATs' CRCs checked, any other
    chunk that is not inert refused (None), up to IEND or the end of the data."""
    parts = []
    position = 8
    end = len(data)
    while position + 12 <= end:
        length, name = struct.unpack(">I4s", data[position : position + 8])
        body_end = position + 8 + length
        if body_end + 4 > end:
            return None
        if name in (b"IHDR", _IDAT):
            crc = _crc32(data[position + 4 : body_end])
            if struct.unpack(">I", data[body_end : body_end + 4])[0] != crc:
                return None
            if name == _IDAT:
                parts.append(data[position + 8 : body_end])
        elif name == b"IEND":
            break
        elif name not in INERT_CHUNKS:
            return None
        position = body_end + 4
    return b"".join(parts)


def _image_module() -> Any:
    if not _pillow:
        from PIL import Image

        _pillow.append(Image)
    return _pillow[0]


def _core() -> Any:
    """Pillow's C core (what its ``Image`` module wraps), without the module."""
    if not _pillow_core:
        from PIL import _imaging

        _pillow_core.append(_imaging)
    return _pillow_core[0]


def _inflate(compressed: bytes, mode: str, width: int, height: int) -> bytes | None:
    """The samples of ``width`` × ``height`` pixels of ``mode`` (``"L"``, ``"RGB"``) in a
    zlib stream of PNG rows, by Pillow's decoder; None if it fails or the data ends short."""
    channels = 1 if mode == "L" else 3
    try:
        fill = _SENTINEL[0] if channels == 1 else _SENTINEL
        picture = _image_module().new(mode, (width, height), fill)
        if not _decode(picture.im, mode, compressed, width, height):
            return None
        samples: bytes = picture.tobytes()
    except (AttributeError, TypeError, ValueError, OSError):
        return None  # another Pillow's internals, or a damaged stream: the full path
    return samples if _complete(samples, compressed, width, height, channels) else None


#: What the last row holds before it is decoded (a pixel of these values, or of the first):
#: Pillow's zip decoder stops at the end of a stream that holds too few rows and says
#: nothing (its check is commented out), so a last row still like this was not decoded,
#: or happens to hold these values (then the stream is inflated again to know which).
_SENTINEL = (0x5A, 0xA5, 0x3C)


def _sentinel_row(width: int) -> bytes:
    return bytes(_SENTINEL[:1]) * width


def _complete(samples: bytes | bytearray, compressed: bytes, width: int, height: int,
              channels: int) -> bool:  # fmt: skip
    """Whether the decoder reached the last row: it no longer holds the sentinel, or the
    stream holds every row's bytes (libpng refuses a PNG whose data ends sooner, "Not
    enough image data", and Caffe skips the image)."""
    row = width * channels
    last = samples[len(samples) - row :]
    if last != (_sentinel_row(width) if channels == 1 else bytes(_SENTINEL) * width):
        return True
    return data_rows_complete(compressed, height * (row + 1))


def data_rows_complete(compressed: bytes | list[memoryview], needed: int) -> bool:
    """Whether a zlib stream (one piece, or IDAT chunks in order) inflates to at least
    ``needed`` bytes; counted 1 MiB at a time, never held. A damaged stream: True (not
    short: the decoder says what is wrong with it)."""
    inflater = zlib.decompressobj()
    total = 0
    try:
        for piece in compressed if isinstance(compressed, list) else [compressed]:
            pending = piece
            while pending and total < needed:
                total += len(inflater.decompress(pending, 1 << 20))
                pending = inflater.unconsumed_tail
            while total < needed and not inflater.eof:
                flushed = inflater.decompress(b"", 1 << 20)
                if not flushed:
                    break
                total += len(flushed)
            if total >= needed:
                return True
    except zlib.error:
        return True
    return total >= needed


#: Adam7's passes: first column and row, and their steps.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))  # fmt: skip
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_data_complete(data: bytes) -> bool:
    """Whether a PNG's image data holds every row its header declares (every pass of an
    interlaced one), as libpng requires of it; True where its chunks cannot be walked (the
    decoder then says what is wrong). Pillow writes the missing rows as 0."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return True
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    if colour not in _CHANNELS or depth not in (1, 2, 4, 8, 16):
        return True
    bits = depth * _CHANNELS[colour]
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    needed = 0
    for x0, y0, dx, dy in passes:
        columns, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if columns > 0 and rows > 0:
            needed += rows * (1 + (columns * bits + 7) // 8)
    parts = []
    view, position, end = memoryview(data), 8, len(data)
    while position + 12 <= end:
        length, name = struct.unpack(">I4s", data[position : position + 8])
        if name == _IDAT:
            parts.append(view[position + 8 : min(end, position + 8 + length)])
        elif name == b"IEND":
            break
        position += 12 + length
    return data_rows_complete(parts, needed)


def _inflate_grey(compressed: bytes, width: int, height: int) -> bytes | bytearray | None:
    """A grey image's samples, inflated into the buffer kept for its size (valid until the
    next call for that size): Pillow's decoder writes straight into it, through an image
    mapped onto it (``frombuffer``), and nothing is copied out but a blank first (Pillow's
    decoder leaves the rows of a stream that ends early as they were). Where it does not
    map it (checked once), a fresh copy, as :func:`_inflate` makes."""
    buffers = getattr(_kept, "grey", None)
    if buffers is None:
        buffers = _kept.grey = {}
    kept = buffers.get((width, height))
    if kept is None:
        kept = _mapped_buffer(width, height) if _maps != [False] else None
        if kept is None:
            return _inflate(compressed, "L", width, height)
        if len(buffers) >= _KEPT_SIZES:
            buffers.clear()
        buffers[(width, height)] = kept
    buffer, mapped, blank = kept
    buffer[:] = blank  # the last row the sentinel: see _complete
    try:
        decoded = _decode(mapped, "L", compressed, width, height)
    except (AttributeError, TypeError, ValueError, OSError):
        return None
    return buffer if decoded and _complete(buffer, compressed, width, height, 1) else None


def _mapped_buffer(width: int, height: int) -> tuple[bytearray, Any, bytes] | None:
    """A buffer of ``width`` × ``height`` grey samples, a Pillow image mapped onto it and a
    blank of its size; None when a change to the buffer does not show in the image (not
    mapped: never again)."""
    buffer = bytearray(width * height)
    try:
        # As Image.frombuffer("L", size, buffer, "raw", "L", 0, 1) maps it: the core image.
        mapped = _core().map_buffer(buffer, (width, height), "raw", 0, ("L", 0, 1))
        buffer[0] = 1
        shared = mapped.getpixel((0, 0)) == 1
        buffer[0] = 0
    except (AttributeError, TypeError, ValueError, OSError):
        shared = False
    if not _maps:
        _maps.append(shared)
    blank = bytes(len(buffer) - width) + _sentinel_row(width)
    return (buffer, mapped, blank) if shared else None


def _decode(core: Any, mode: str, compressed: bytes, width: int, height: int) -> bool:
    """Inflate and unfilter ``compressed`` into Pillow's image ``core``; True when every row
    was decoded (a damaged or short stream: False)."""
    decoder = _core().zip_decoder(mode, mode)  # Image._getdecoder(mode, "zip", mode)
    decoder.setimage(core, (0, 0, width, height))
    consumed, error = decoder.decode(compressed)
    decoder.cleanup()
    return bool(consumed < 0 and error >= 0)
