"""Image files read as Caffe's OpenCV reads them, with Pillow and numpy.

Caffe's ``convert_imageset`` reads each image with ``cv::imread(path, IMREAD_COLOR)`` (or
``IMREAD_GRAYSCALE`` with ``--gray``) and stores the pixels BGR, channel after channel. The
pixels OpenCV 4.6 returns follow per-format rules, reproduced here (:func:`decode_image`):

* colour: BGR; a grey image has its value in all three channels; alpha is dropped (never
  blended); palettes are expanded; 16-bit samples keep their high byte;
* grey, by format: JPEG gives libjpeg's luma (the Y channel, as decoded, not recomputed);
  PNG libpng's truncating ``(9797 R + 19234 G + 3737 B) >> 15`` (computed on 16-bit samples
  before their high byte is kept); BMP, PPM and TIFF OpenCV's rounded
  ``(4899 R + 9617 G + 1868 B + 8192) >> 14``; WebP ``cvtColor``'s 15-bit
  ``(9798 R + 19235 G + 3735 B + 16384) >> 15``; CMYK JPEGs OpenCV's own CMYK conversion;
* TIFF's unassociated alpha is multiplied in (libtiff's RGBA interface, rounded);
* the EXIF orientation of a JPEG or PNG is applied (flips and a transpose, ``ExifTransform``).

Writing them as ``cv::imencode`` does is :mod:`mnist2db.formats.imread.imencode`'s.
"""

from __future__ import annotations

import math
import os
import re
import struct
from typing import Any

import numpy as np

from mnist2db.errors import ImageError
from mnist2db.formats.imdecode.image_file import (
    check_declared_size,
    declared_size,
    image_format,
    open_with_pillow,
    read_image_file,
)
from mnist2db.formats.imread.cv2_wheel import opencv, reads_cut_jpegs
from mnist2db.formats.imread.png16 import decode_png16
from mnist2db.formats.jpeg_scans import completed_jpeg
from mnist2db.formats.plain_png import plain_samples, png_data_complete

#: The formats OpenCV 4.6 reads, by Pillow's name for them (GIF is not among them).
READ_FORMATS = ("BMP", "JPEG", "MPO", "PNG", "PPM", "TIFF", "WEBP")

#: OpenCV's rounded grey weights (``icvCvt_BGR2Gray_8u``, ``cvtColor``), 14-bit fixed point.
_CV_R, _CV_G, _CV_B = 4899, 9617, 1868
#: ``cvtColor(COLOR_BGR2GRAY)`` (WebP's grey): rounded 15-bit weights.
_CV15_R, _CV15_G, _CV15_B = 9798, 19235, 3735
#: libpng's ``png_set_rgb_to_gray(png, 1, 0.299, 0.587)``: truncated 15-bit weights, blue
#: the rest of 32768.
_PNG_R, _PNG_G, _PNG_B = 9797, 19234, 3737
_EXIF_ORIENTATION = 0x0112


def read_image(path: str | bytes, *, color: bool) -> np.ndarray:
    """The pixels of the image file at ``path`` as ``cv::imread`` returns them: ``(h, w, 3)``
    BGR when ``color``, else ``(h, w)`` grey; uint8.

    Raises:
        ImageError: the file cannot be opened, or is not an image OpenCV reads (the message
            names the path and why).
    """
    return decode_image(read_image_file(path), color=color, where=os.fsdecode(path))


def decode_image(data: bytes, *, color: bool | None, where: str) -> np.ndarray:
    """Decode image bytes as ``cv::imdecode`` does: ``color`` True for ``IMREAD_COLOR``
    (``(h, w, 3)`` BGR), False for ``IMREAD_GRAYSCALE`` (``(h, w)``), None for the image's
    own kind (grey images grey, every other colour; alpha dropped, no EXIF orientation:
    what Caffe's data layer gets from an encoded Datum).

    A JPEG missing only its final EOI marker (its scans whole) is read in colour or grey as
    libjpeg reads it from a file, with the EOI put back
    (:func:`mnist2db.formats.jpeg_scans.completed_jpeg`); one cut anywhere before is refused.

    Raises:
        ImageError: not an image OpenCV reads, or damaged (naming ``where``).
    """
    return _decode_image(data, color, where, complete=True)


def _decode_image(data: bytes, color: bool | None, where: str, *, complete: bool) -> np.ndarray:
    """:func:`decode_image`; ``complete``: whether a JPEG refused is tried with its EOI put
    back (False: the caller knows it is not whole but for its EOI)."""
    kind = image_format(data)
    if kind == "PNG":
        plain = plain_samples(data)
        if plain is not None:
            mode, width, height, raw = plain
            grey = mode == "L"
            shape = (height, width) if grey else (height, width, 3)
            pixels = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
            want = (not grey) if color is None else color
            return _convert(pixels, "grey" if grey else "rgb", kind, want, None)
    if kind is None:
        raise ImageError(f"{where}: not an image OpenCV reads (PNG, JPEG, BMP, PPM, TIFF, WebP)")
    check_declared_size(data, kind, where)
    if kind == "PNG" and not png_data_complete(data):
        raise ImageError(f"{where}: PNG image data ends before its last row (truncated)")
    if kind == "JPEG" and color is not None:
        cv2 = opencv()
        if cv2 is not None and _opencv_jpeg(cv2, data):
            flag = cv2.IMREAD_COLOR if color else cv2.IMREAD_GRAYSCALE
            decoded = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flag)
            if decoded is not None:
                fast: np.ndarray = decoded
                return fast
    try:
        with open_with_pillow(data, kind) as opened:
            pixels, model = _samples(opened, kind, color, data)
            gamma = _png_gamma(dict(opened.info)) if kind == "PNG" else None
            orientation = _orientation(kind, data, opened, color)
    except _pillow_refusals() as exc:
        refused = ImageError(f"{where}: {kind} image cannot be decoded: {exc}")
        # (imread's reading of a file: imdecode's of a buffer, color None, is left as it was)
        whole = completed_jpeg(data) if complete and kind == "JPEG" and color is not None else None
        if whole is None:
            raise refused from None
        try:
            return _decode_image(whole, color, where, complete=False)
        except ImageError:
            raise refused from None
    if color is None:
        color = model != "grey"
    image = _convert(pixels, model, kind, color, gamma)
    return _orient(image, orientation)


def _pillow_refusals() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file it cannot decode (Pillow loaded: only the images
    OpenCV does not decode need it). A Warning: one a caller's filter made an error (a
    corrupt EXIF, ...)."""
    from PIL import UnidentifiedImageError
    from PIL.Image import DecompressionBombError

    return (OSError, UnidentifiedImageError, ValueError, SyntaxError, struct.error,
            DecompressionBombError, Warning)  # fmt: skip


def _orientation(kind: str, data: bytes, opened: Any, color: bool | None) -> int:
    """The EXIF orientation OpenCV applies to the image (1: none)."""
    if _may_orient(kind, data, opened) and color is not None:
        return int(opened.getexif().get(_EXIF_ORIENTATION, 1) or 1)
    return 1


def image_shape(data: bytes, *, color: bool, where: str) -> tuple[int, int, int]:
    """The ``(channels, height, width)`` of the image :func:`decode_image` decodes from
    ``data``, refused where it refuses it: what Caffe's ``ReadImageToDatum`` decodes for
    when it stores a file's own bytes (``--encoded``, no resize), its pixels never used.

    A JPEG is decoded at an eighth of its size (libjpeg's DCT scaling: every marker is still
    parsed and every coefficient entropy-decoded; most of the IDCT, the upsampling and the
    colour conversion are skipped), by the decoder the full decode would use; one it does
    not read, and every other format, are decoded in full, so that what is refused, and the
    reason given, are the full decode's own (tests/formats/test_image_shape.py: a hostile
    corpus of JPEGs, on both paths, in colour and grey). One missing only its EOI marker is
    decided on its bytes with the EOI put back, as the full decode reads it.

    Raises:
        ImageError: as :func:`decode_image` raises it.
    """
    complete = True
    if image_format(data) == "JPEG":
        size = _reduced_jpeg_size(data, color, where)
        if size is None:
            # One missing only its EOI: read, as the full decode reads it, with it put back.
            whole = completed_jpeg(data)
            complete = whole is not None  # (not whole: the full decode need not walk it again)
            if whole is not None:
                size = _reduced_jpeg_size(whole, color, where)
        if size is not None:
            return 3 if color else 1, size[1], size[0]
    image = _decode_image(data, color, where, complete=complete)
    return 1 if image.ndim == 2 else int(image.shape[2]), int(image.shape[0]), int(image.shape[1])


#: libjpeg's smallest DCT scaling, 1/8: a block's DC coefficient alone is inverse-transformed.
_REDUCED = 8


def _reduced_jpeg_size(data: bytes, color: bool, where: str) -> tuple[int, int] | None:
    """A JPEG's ``(width, height)`` as :func:`decode_image` would return it (the EXIF
    orientation applied), once the decoder the full decode would use has read it at an
    eighth of its size; None where that decoder does not read it, or anything differs
    from the full decode's steps (the full decode then decides, and says why).

    Raises:
        ImageError: the size the header declares is one OpenCV refuses.
    """
    check_declared_size(data, "JPEG", where)  # the full decode's first refusal, as it words it
    declared = declared_size(data, "JPEG")
    if declared is None:
        return None
    width, height = declared
    small = ((height + _REDUCED - 1) // _REDUCED, (width + _REDUCED - 1) // _REDUCED)
    cv2 = opencv()
    if cv2 is not None and _opencv_jpeg(cv2, data):
        flag = cv2.IMREAD_REDUCED_COLOR_8 if color else cv2.IMREAD_REDUCED_GRAYSCALE_8
        decoded = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flag)
        if decoded is None or decoded.shape[:2] != small:
            return None
        return width, height
    try:
        with open_with_pillow(data, "JPEG") as opened:
            if opened.size != declared:
                return None
            grey = not color and opened.mode in ("RGB", "YCbCr")  # libjpeg's own luma
            # Pillow scales by the largest of 8, 4, 2 that fits the size asked for.
            asked = (max(1, width // _REDUCED), max(1, height // _REDUCED))
            opened.draft("L" if grey else opened.mode, asked)
            if opened.size != (small[1], small[0]) or opened.mode not in ("L", "RGB", "CMYK"):
                return None
            opened.load()
            orientation = _orientation("JPEG", data, opened, color)
    except _pillow_refusals():
        return None
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


#: JPEG markers that start a frame (SOF0-3, 5-7, 9-11, 13-15): its precision and components.
_SOF_MARKERS = frozenset((*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC),
                          *range(0xCD, 0xD0)))  # fmt: skip


def _opencv_jpeg(cv2: Any, data: bytes) -> bool:
    """Whether OpenCV's wheel decodes ``data`` here: a plain JPEG (:func:`_plain_jpeg`), and,
    where the wheel reads a JPEG cut short as if it were whole
    (:func:`~mnist2db.formats.imread.cv2_wheel.reads_cut_jpegs`), one that ends in its EOI marker; any
    other takes the Pillow path, which refuses a cut one (and reads one missing only its EOI
    with it put back, :func:`decode_image`)."""
    return _plain_jpeg(data) and (data.endswith(b"\xff\xd9") or not reads_cut_jpegs(cv2))


def _plain_jpeg(data: bytes) -> bool:
    """Whether a JPEG is one OpenCV's wheel decodes as Caffe's OpenCV does (both libjpeg-turbo,
    proved by the corpus and the tests): 8-bit grey or YCbCr/RGB, no EXIF (whose orientation
    the two OpenCVs may apply differently). Anything else takes the Pillow path."""
    position, end = 2, min(len(data), 1 << 16)
    while position + 4 <= end:
        if data[position] != 0xFF:
            return False
        marker = data[position + 1]
        if marker == 0xFF:
            position += 1
            continue
        length = (data[position + 2] << 8) | data[position + 3]
        if marker == 0xE1 and data[position + 4 : position + 10] == b"Exif\x00\x00":
            return False
        if marker in _SOF_MARKERS:
            head = data[position + 4 : position + 10]
            return len(head) == 6 and head[0] == 8 and head[5] in (1, 3)
        if marker == 0xDA or length < 2:
            return False
        position += 2 + length
    return False


def png_planes(data: bytes, color: bool) -> tuple[bytes, tuple[int, int, int]] | None:
    """A plain PNG's pixels as Caffe's ``CVMatToDatum`` stores them, channel after channel
    (BGR), and their ``(channels, height, width)``; None when the full path must decode it
    (not a plain PNG, or grey wanted of a colour one). No numpy: the commonest case of
    ``convert_imageset`` costs a file read, an inflate and a few byte copies (from a path,
    :func:`mnist2db.formats.plain_png.plain_record` makes the whole record)."""
    plain = plain_samples(data)
    if plain is None:
        return None
    mode, width, height, raw = plain
    if mode == "L":
        return (raw * 3, (3, height, width)) if color else (raw, (1, height, width))
    if not color:
        return None
    return raw[2::3] + raw[1::3] + raw[0::3], (3, height, width)


def _may_orient(kind: str, data: bytes, opened: Any) -> bool:
    """Whether the image may carry an EXIF orientation OpenCV applies: a JPEG with an
    ``Exif`` APP1 segment, a PNG with an ``eXIf`` chunk (reading EXIF costs a parse)."""
    if kind == "JPEG":
        return b"Exif\x00\x00" in data[:65536]
    return kind == "PNG" and (b"eXIf" in data or "exif" in opened.info)


def _samples(opened: Any, kind: str, color: bool | None, data: bytes) -> tuple[np.ndarray, str]:
    """The image's 8-bit samples and their model: ``"grey"`` (h, w), ``"rgb"`` (h, w, 3)
    (or (h, w, 3) uint16 for a 16-bit colour PNG), ``"cmyk"`` (h, w, 4) as libjpeg gives them."""
    mode = opened.mode
    if kind == "JPEG" and color is False and mode in ("RGB", "YCbCr"):
        # libjpeg's own grey output: the Y channel, chroma never converted.
        opened.draft("L", opened.size)
        mode = opened.mode
    if kind == "PNG" and mode in ("RGB", "RGBA") and _png_layout(opened) == (16, 0):
        return _png16_rgb(opened), "rgb"
    inverted = kind == "JPEG" and _inverted_cmyk(opened)  # read before load() drops the tiles
    opened.load()
    if mode == "1":
        return np.asarray(opened.convert("L")), "grey"
    if kind == "PPM" and mode in ("L", "RGB"):
        top = _pnm_maxval(data)
        if top < 255:
            # OpenCV keeps the samples as stored; Pillow stretches them to 0..255.
            stretched = np.rint(np.arange(top + 1) * 255 / top).astype(np.int64)
            back = np.zeros(256, dtype=np.uint8)
            back[stretched] = np.arange(top + 1, dtype=np.uint8)
            return back[np.asarray(opened)], "grey" if mode == "L" else "rgb"
    if mode in ("L", "LA", "La"):
        return np.asarray(opened if mode == "L" else opened.getchannel(0)), "grey"
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        wide = np.asarray(opened).astype(np.int64)
        top = 255 if kind == "PPM" and opened.info.get("maxval", 65535) <= 255 else 65535
        if top == 255:
            return wide.clip(0, 255).astype(np.uint8), "grey"
        return (wide.clip(0, 65535) >> 8).astype(np.uint8), "grey"
    if mode in ("P", "PA"):
        return np.asarray(opened.convert("RGB")), "rgb"
    if mode == "RGBA" and kind == "TIFF":
        # libtiff's TIFFReadRGBA* (OpenCV's path for these) multiplies unassociated alpha in.
        wide = np.asarray(opened).astype(np.uint32)
        return ((wide[:, :, :3] * wide[:, :, 3:] + 127) // 255).astype(np.uint8), "rgb"
    if mode in ("RGB", "RGBA", "RGBX", "RGBa"):
        return np.asarray(opened)[:, :, :3], "rgb"
    if mode == "CMYK" and kind == "TIFF":
        # libtiff's RGBA interface: each of C, M, Y against the inverted K, truncated.
        wide = np.asarray(opened).astype(np.uint32)
        ink = 255 - wide[:, :, 3:]
        return (ink * (255 - wide[:, :, :3]) // 255).astype(np.uint8), "rgb"
    if mode == "CMYK":
        samples = np.asarray(opened)
        if inverted:
            samples = 255 - samples  # Pillow inverts Adobe's CMYK; libjpeg gives it as stored
        return samples, "cmyk"
    raise ValueError(f"{mode} pixels are not 8- or 16-bit grey or colour")


def _pnm_maxval(data: bytes) -> int:
    """The maximum sample value in a PGM/PPM header (P2/P3/P5/P6); 1 for a bitmap."""
    if data[1:2] in (b"1", b"4"):
        return 1
    fields = re.sub(rb"#[^\n]*", b" ", bytes(data[2:512])).split()
    return int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 255


def _png_gamma(info: dict[Any, Any]) -> int | None:
    """A PNG's gamma as libpng holds it (1/100000), when it makes libpng's grey conversion
    go through linear light: an sRGB chunk (45455) or a gAMA chunk away from 1.0."""
    if "srgb" in info:
        value = 45455
    elif "gamma" in info:
        value = int(round(float(info["gamma"]) * 100000))
    else:
        return None
    return value if value and not 95000 <= value <= 105000 else None


def _png_gamma_tables(gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """libpng's 8-bit ``gamma_to_1`` and ``gamma_from_1`` tables for a file gamma."""

    def reciprocal(value: float) -> int:
        return int(math.floor(1e10 / value + 0.5))

    def table(exponent: int) -> np.ndarray:
        values = [0] + [
            int(math.floor(255 * math.pow(i / 255.0, exponent * 0.00001) + 0.5))
            for i in range(1, 255)
        ]
        return np.array(values + [255], dtype=np.int64)

    screen = reciprocal(gamma)
    return table(reciprocal(gamma)), table(reciprocal(screen))


def _png_layout(opened: Any) -> tuple[int, int]:
    """A PNG's bit depth and interlace method, from its header (Pillow reduces 16-bit
    colour to 8 bits; an interlaced one is left to it, the one known difference)."""
    fp = opened.fp
    where = fp.tell()
    try:
        fp.seek(24)
        header = fp.read(5)
    finally:
        fp.seek(where)
    return header[0], header[4]


def _inverted_cmyk(opened: Any) -> bool:
    return any(tile[3][0] == "CMYK;I" for tile in getattr(opened, "tile", []) if tile[3])


def _png16_rgb(opened: Any) -> np.ndarray:
    """A 16-bit colour PNG's samples in full (h, w, 3) uint16, alpha dropped: libpng's grey
    conversion works on them before keeping the high byte, and Pillow keeps only that."""
    return decode_png16(opened.fp, opened.size)


def _convert(
    pixels: np.ndarray, model: str, kind: str, color: bool, gamma: int | None
) -> np.ndarray:
    if model == "cmyk":
        return _cmyk(pixels, color)
    if model == "grey":
        grey = np.ascontiguousarray(pixels, dtype=np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2) if color else grey
    if color:
        if pixels.dtype != np.uint8:
            pixels = (pixels >> 8).astype(np.uint8)
        return np.ascontiguousarray(pixels[:, :, ::-1])
    wide = pixels.astype(np.int64)
    r, g, b = wide[:, :, 0], wide[:, :, 1], wide[:, :, 2]
    if kind == "PNG" and gamma is not None and pixels.dtype == np.uint8:
        # libpng's gamma path: weights applied in linear light, rounded, and back.
        to_linear, from_linear = _png_gamma_tables(gamma)
        mixed = (
            _PNG_R * to_linear[r] + _PNG_G * to_linear[g] + _PNG_B * to_linear[b] + (1 << 14)
        ) >> 15
        same = (r == g) & (g == b)
        return np.where(same, r, from_linear[mixed]).astype(np.uint8)
    if kind == "PNG":
        weighted: np.ndarray = (_PNG_R * r + _PNG_G * g + _PNG_B * b) >> 15
        if pixels.dtype != np.uint8:
            weighted = weighted >> 8
        return weighted.astype(np.uint8)
    if kind == "WEBP":
        return ((_CV15_R * r + _CV15_G * g + _CV15_B * b + (1 << 14)) >> 15).astype(np.uint8)
    return ((_CV_R * r + _CV_G * g + _CV_B * b + (1 << 13)) >> 14).astype(np.uint8)


def _cmyk(samples: np.ndarray, color: bool) -> np.ndarray:
    """OpenCV's ``icvCvt_CMYK2BGR_8u`` / ``icvCvt_CMYK2Gray_8u`` on libjpeg's CMYK."""
    wide = samples.astype(np.int64)
    k = wide[:, :, 3]
    c, m, y = (k - (((255 - wide[:, :, i]) * k) >> 8) for i in range(3))
    if color:
        bgr: np.ndarray = np.stack([y, m, c], axis=2).astype(np.uint8)
        return bgr
    grey: np.ndarray = ((_CV_B * y + _CV_G * m + _CV_R * c + (1 << 13)) >> 14).astype(np.uint8)
    return grey


def _orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """OpenCV's ``ExifTransform``: the EXIF orientation undone by flips and a transpose."""
    if orientation in (5, 6, 7, 8):
        image = np.swapaxes(image, 0, 1)
    flips = {2: (1,), 3: (0, 1), 4: (0,), 6: (1,), 7: (0, 1), 8: (0,)}.get(orientation, ())
    for axis in flips:
        image = np.flip(image, axis)
    return np.ascontiguousarray(image)


def to_chw(image: np.ndarray) -> np.ndarray:
    """``(h, w)`` or ``(h, w, c)`` pixels as Caffe's ``CVMatToDatum`` orders them: ``(c, h, w)``."""
    if image.ndim == 2:
        return np.ascontiguousarray(image)[None]
    return np.ascontiguousarray(image.transpose(2, 0, 1))
