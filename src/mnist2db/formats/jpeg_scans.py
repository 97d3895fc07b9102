"""Whether a JPEG that does not end in its EOI marker is whole but for it (:func:`completed_jpeg`).

Caffe's ``cv::imread`` (libjpeg's ``jpeg_stdio_src``) reads a file that ends early as if an
EOI marker (FF D9) followed its last byte ("Premature end of JPEG file"): a file missing only
its EOI is read as the whole image, and so is it read here, with the EOI put back. A file cut
before (libjpeg's made-up zeros, a progressive image's refinements never made) stays refused:
what decoders make of a short scan is not proved equal to Caffe's.

Whole is decided by the decoder itself: the scan headers give every coefficient of every
component its last bit, and the image decodes the same whether the EOI follows the data or
other bytes come first. libjpeg skips bytes after a whole scan, and decodes them as the
scan's own when the scan is short.
"""

from __future__ import annotations

import hashlib
import re
import struct

from mnist2db.formats.imdecode.image_file import declared_size, open_with_pillow

#: The marker a JPEG ends with.
EOI = b"\xff\xd9"
#: The most pixels a JPEG missing its EOI may declare to be decoded for the test (three
#: decodes in full, one after another): a 64 MP photo. A larger one stays refused.
MAX_PIXELS = 1 << 26
#: Bytes put before the EOI to see whether the last scan would read them: ones (a stuffed
#: FF), and alternating bits.
_PADDINGS = (b"\xff\x00" * 32, b"\x55" * 64)
#: A marker, with its fill bytes, ending a scan's data (a restart marker does not).
_MARKER = re.compile(rb"\xff+[^\x00\xff\xd0-\xd7]")
#: A restart marker inside a scan's data.
_RESTART = re.compile(rb"\xff+[\xd0-\xd7]")


def completed_jpeg(data: bytes) -> bytes | None:
    """``data`` with its EOI marker put back, when ``data`` is a JPEG whose scans are all
    whole and whose only missing part is that EOI (and whatever followed it): what Caffe's
    libjpeg reads from the file. None for any other bytes. Decided with Pillow's decode
    (silent, and the same with OpenCV's wheel or without), in full: an eighth-size decode
    leaves out the coefficients a short last scan may lack."""
    if not data.startswith(b"\xff\xd8") or data.endswith(EOI) or not _every_bit_scanned(data):
        return None
    size = declared_size(data, "JPEG")
    if size is None or size[0] * size[1] > MAX_PIXELS:
        return None
    whole, stem = data + EOI, data.rstrip(b"\xff")  # (an FF left: the EOI's first byte)
    pixels = _pixel_digest(whole)
    if pixels is None or any(pixels != _pixel_digest(stem + pad + EOI) for pad in _PADDINGS):
        return None
    return whole


def _pixel_digest(data: bytes) -> bytes | None:
    """The SHA-256 of a JPEG's pixels as Pillow decodes them, taken in strips (no copy of
    the whole); None where Pillow refuses it."""
    try:
        with open_with_pillow(data, "JPEG") as opened:
            opened.load()
            digest, (width, height) = hashlib.sha256(), opened.size
            for top in range(0, height, 64):
                digest.update(opened.crop((0, top, width, min(height, top + 64))).tobytes())
            return digest.digest()
    except (OSError, ValueError, SyntaxError, struct.error, Warning):  # (a warning made an error)
        return None


def _every_bit_scanned(data: bytes) -> bool:
    """Whether the headers of ``data`` (an 8-bit Huffman JPEG, baseline, extended or
    progressive) bring every component's every coefficient to its last bit, the file
    ending in its last scan's data (or after it), not in a segment nor, where restart
    markers divide the scan, before its last interval."""
    at, end, progressive, interval = 2, len(data), False, 0
    bits: dict[int, list[int]] = {}
    frame: tuple[int, int, dict[int, tuple[int, int]]] = (0, 0, {})
    while at < end:
        while at < end and data[at] == 0xFF:
            at += 1
        if at + 3 > end:
            return False
        marker = data[at]
        (length,) = struct.unpack(">H", data[at + 1 : at + 3])
        body, at = data[at + 3 : at + 1 + length], at + 1 + length
        if length < 2 or at > end:
            return False
        if marker in (0xC0, 0xC1, 0xC2):
            if bits or len(body) < 6 or body[0] != 8 or len(body) != 6 + 3 * body[5]:
                return False
            progressive = marker == 0xC2
            fields = [body[6 + 3 * i : 8 + 3 * i] for i in range(body[5])]
            factors = {ident: (f >> 4, f & 15) for ident, f in fields}
            frame = (*struct.unpack(">HH", body[1:5]), factors)
            bits = {ident: [-1] * 64 for ident in factors}
        elif marker == 0xDD and len(body) == 2:
            (interval,) = struct.unpack(">H", body)
        elif marker == 0xDA:
            count = body[0] if body else 0
            if not bits or len(body) != 4 + 2 * count:
                return False
            start, stop, al = body[-3], body[-2], body[-1] & 15
            if not progressive:
                start, stop, al = 0, 63, 0
            idents = list(body[1 : 1 + 2 * count : 2])
            if start > stop or stop > 63 or not set(idents) <= set(bits):
                return False
            for ident in idents:
                bits[ident][start : stop + 1] = [al] * (stop + 1 - start)
            found = _MARKER.search(data, at)
            if found is None:
                restarts = len(_RESTART.findall(data, at))
                return (
                    not interval or restarts + 1 == -(-_mcus(frame, idents) // interval)
                ) and all(bit == 0 for each in bits.values() for bit in each)
            at = found.start()
        elif marker not in (0xC4, 0xDB, *range(0xE0, 0xF0), 0xFE):
            return False  # EOI, arithmetic coding, lossless, DNL, ...: not vouched for
    return bool(bits) and all(bit == 0 for each in bits.values() for bit in each)


def _mcus(frame: tuple[int, int, dict[int, tuple[int, int]]], idents: list[int]) -> int:
    """The MCUs of a scan of the components ``idents`` in ``frame`` (height, width, each
    component's sampling factors)."""
    height, width, factors = frame
    hmax, vmax = max(h for h, _ in factors.values()), max(v for _, v in factors.values())
    if len(idents) > 1:
        return _ceil(width, 8 * hmax) * _ceil(height, 8 * vmax)
    h, v = factors[idents[0]]
    return _ceil(_ceil(width * h, hmax), 8) * _ceil(_ceil(height * v, vmax), 8)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)
