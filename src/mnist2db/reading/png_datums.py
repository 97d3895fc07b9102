"""PNG-encoded Datums read without protobuf: one record (:func:`decode_png_record`), and the
records of a database in the layout of its first one, alone or a batch at a time
(:class:`PngRecords`: the reading API's fast paths).

A Datum as :mod:`mnist2db.formats.png.encoder` writes it is, byte for byte::

    08 01 10 <rows> 18 <cols> 22       channels, height, width; the tag of data
    <PNG length, a varint>
    89 50 4E 47 0D 0A 1A 0A            the PNG signature
    <IHDR chunk, 25 bytes>             the same in every record of a database
    <IDAT length, 4 bytes> "IDAT" <zlib stream> <CRC, 4 bytes>
    00 00 00 00 "IEND" AE 42 60 82     the IEND chunk
    28 <label>  38 01                  label (below 128: one byte), encoded: true

Given the database's first record, everything in a record but the zlib stream, its CRC
and the label is a function of the record's length; so a record is checked by two slice
compares, the CRC, and, once inflated, the inflated length and the rows' filter bytes
(all 0: None). A record that differs anywhere is not decoded here but by the general
decoder (protobuf, then :func:`~mnist2db.formats.imdecode.png_decoder.decode_datum_image`), which gives the
same image and label where this gives one, and names what is wrong where it refuses.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.formats.imdecode.png_decoder import (
    HEADERS_MAX,
    INFLATE_SLACK,
    ONE_SHOT,
    decode_png,
    parse_header,
)
from mnist2db.formats.png.deflate import INFLATE_RATIO
from mnist2db.formats.png.encoder import IEND_CHUNK, PNG_SIGNATURE
from mnist2db.formats.protowire import encode_varint

#: Inflates many zlib streams: ``inflate(streams, size)`` gives each one's inflated bytes
#: when they are exactly ``size`` bytes, else ``b""`` (:func:`mnist2db.reading.threaded.inflate_many`).
Inflate = Callable[[Sequence[bytes], int], list[bytes]]

_IDAT_CRC = zlib.crc32(b"IDAT")
#: After the zlib stream: its CRC (4 bytes), IEND (12), label and encoded (4).
_TAIL = 4 + len(IEND_CHUNK) + 4
#: Record lengths whose layout is remembered (each a few dozen bytes).
_PREFIXES_MAX = 4096
_crc32 = zlib.crc32
_decompress = zlib.decompress
_from_bytes = int.from_bytes
_ndarray = np.ndarray
_uint8 = np.dtype(np.uint8)


def _shape_head_end(value: bytes) -> int:
    """The offset just past ``08 <varint> 10 <varint> 18 <varint> 22`` at the start of
    ``value`` (fields 1-3, each a varint of at most 10 bytes, and the tag of field 4,
    ``data``), or 0 when it does not begin so."""
    pos = 0
    for tag in (0x08, 0x10, 0x18):
        if value[pos : pos + 1] != bytes((tag,)):
            return 0
        pos += 1
        for count in range(10):  # a varint: at most 10 bytes, the last below 0x80
            if pos >= len(value):
                return 0
            pos += 1
            if value[pos - 1] < 0x80:
                break
            if count == 9:
                return 0
    return pos + 1 if value[pos : pos + 1] == b"\x22" else 0


class PngRecords:
    """The layout shared by a database's PNG records: the Datum's head (its shape fields)
    and the PNG's signature and IHDR, taken from one record (:meth:`from_record`).

    :meth:`read` decodes one record, :meth:`read_many` a batch; both leave every record
    that is not in this layout, or not exactly as mnist2db writes it, to the caller's
    general decoder. Only 8-bit grey images whose rows are all unfiltered (filter type
    None) are read here: what ``convert --encoded png`` writes.
    """

    __slots__ = ("filters", "head", "png_head", "prefixes", "raw_size", "shape", "stride", "tails")

    def __init__(self, head: bytes, png_head: bytes) -> None:
        """``head``: the Datum's bytes before the PNG's length; ``png_head``: the PNG's first
        33 bytes (signature and IHDR chunk), which must describe an 8-bit grey image.

        Raises:
            DatumError: ``png_head`` is not that.
        """
        header = parse_header(png_head[8:], "PNG")
        if png_head[:8] != PNG_SIGNATURE or header.colour != 0 or not header.fast:
            raise DatumError("PNG: not the signature and header of an 8-bit grey image")
        self.head = head
        self.png_head = png_head
        self.shape = header.shape
        self.stride = header.row_bytes + 1
        self.raw_size = header.raw_size
        #: Every row's filter byte, 0 (None), as ``raw[::stride]`` reads them.
        self.filters = bytes(header.height)
        #: The last 16 bytes of a record by its label byte (``value[-3]``): IEND, then
        #: ``28 <label> 38 01``. A byte of 0x80 or more there is the end of a longer varint,
        #: not a one-byte label: its entry is 3 bytes whose first is 0, which a value whose
        #: third-last byte is that byte cannot end with.
        self.tails = tuple(
            IEND_CHUNK + bytes((0x28, label, 0x38, 0x01)) if label < 0x80 else b"\0\0\0"
            for label in range(256)
        )
        #: Record length -> the bytes every record of that length begins with, up to its
        #: zlib stream; b"" when no record of that length is in the layout.
        self.prefixes: dict[int, bytes] = {}

    def __reduce__(self) -> tuple[type[PngRecords], tuple[bytes, bytes]]:
        return PngRecords, (self.head, self.png_head)

    @classmethod
    def from_record(cls, value: bytes) -> PngRecords | None:
        """The layout of ``value``'s database if ``value`` is a PNG record of an 8-bit grey
        image as mnist2db writes it, else None."""
        start = _shape_head_end(value)
        if not start:
            return None
        for size in range(1, 6):  # the PNG's length: a varint
            png = start + size
            if value[png : png + 8] == PNG_SIGNATURE:
                try:
                    layout = cls(value[:start], value[png : png + 33])
                except DatumError:
                    return None
                return layout if layout.read(value) is not None else None
        return None

    def prefix(self, size: int) -> bytes:
        """The bytes a record of ``size`` bytes begins with, up to its zlib stream (b"" when
        no record of that length is in the layout). Remembered: a database's records have
        a few hundred lengths."""
        prefix = self.prefixes.get(size)
        if prefix is None:
            prefix = self._prefix(size)
            if len(self.prefixes) >= _PREFIXES_MAX:
                self.prefixes.clear()
            self.prefixes[size] = prefix
        return prefix

    def _prefix(self, size: int) -> bytes:
        # The PNG's length is a varint of 1 to 5 bytes (protobuf's minimal form: a record
        # that writes it longer takes the general path); one length at most fits.
        for count in range(1, 6):
            png_size = size - len(self.head) - count - 4
            if png_size <= 0 or len(encode_varint(png_size)) != count:
                continue
            stream = png_size - len(self.png_head) - 12 - len(IEND_CHUNK)
            # Inflated in one call, so the stream's worst case must be small (the decoder's
            # own bound, ONE_SHOT); and one that cannot hold the image, or is more than
            # twice its size (no encoder writes such), is the general decoder's to judge:
            # that also bounds what a hostile stream makes a batch hold.
            if (
                self.raw_size <= INFLATE_RATIO * stream + INFLATE_SLACK <= ONE_SHOT
                and stream <= 2 * self.raw_size + 64
            ):
                return (
                    self.head
                    + encode_varint(png_size)
                    + self.png_head
                    + struct.pack(">I", stream)
                    + b"IDAT"
                )
            break
        return b""

    def read(self, value: bytes) -> tuple[np.ndarray, int] | None:
        """``(image, label)`` of a record in this layout: a fresh ``(1, h, w)`` uint8 array
        and an int; None for any other record, or one that fails a check."""
        prefix = self.prefixes.get(len(value))
        if prefix is None:
            prefix = self.prefix(len(value))
        if not (prefix and value.startswith(prefix) and value.endswith(self.tails[value[-3]])):
            return None
        data = value[len(prefix) : -_TAIL]
        if _crc32(data, _IDAT_CRC) != _from_bytes(value[-_TAIL : 4 - _TAIL], "big"):
            return None
        try:
            raw = _decompress(data)
        except zlib.error:
            return None
        stride = self.stride
        if len(raw) != self.raw_size or raw[::stride] != self.filters:
            return None
        pixels = bytearray(raw)
        del pixels[::stride]
        return _ndarray(self.shape, _uint8, pixels), value[-3]

    def read_many(
        self, values: Sequence[bytes], inflate: Inflate
    ) -> tuple[np.ndarray, list[int], list[int]]:
        """The records in this layout among ``values``, in one pass: ``(images, labels,
        misses)``, ``images`` a fresh ``(n, 1, h, w)`` uint8 array and ``labels`` n ints,
        both in the order of ``values``; ``misses`` the positions (ascending) of the records
        not read here, whose entries in ``images`` and ``labels`` are undefined.

        ``inflate`` inflates the zlib streams (on threads: it is the only work per record
        outside this thread)."""
        prefixes, tails, prefix_of = self.prefixes, self.tails, self.prefix
        streams: list[bytes] = []
        misses: list[int] = []
        for i, value in enumerate(values):
            prefix = prefixes.get(len(value)) or prefix_of(len(value))
            if prefix and value.startswith(prefix) and value.endswith(tails[value[-3]]):
                data = value[len(prefix) : -_TAIL]
                if _crc32(data, _IDAT_CRC) == _from_bytes(value[-_TAIL : 4 - _TAIL], "big"):
                    streams.append(data)
                    continue
            misses.append(i)
        labels = [value[-3] if len(value) > 2 else 0 for value in values]
        hits: Sequence[int] = range(len(values))
        if misses:
            hits = sorted(set(hits) - set(misses))
        raws = inflate(streams, self.raw_size)
        n, (_, height, width), stride = len(values), self.shape, self.stride
        # One buffer, every filter byte checked (0) and deleted in place: fewer passes over
        # the memory than a copy of the rows without them (this is memory-bound).
        joined = bytearray().join(raws)
        if (
            not misses
            and len(joined) == n * self.raw_size
            and joined[::stride] == bytes(n * height)
        ):
            del joined[::stride]
            return np.frombuffer(joined, _uint8).reshape(n, 1, height, width), labels, misses
        # Some records are not in the layout: place the others one by one.
        images = np.zeros((n, 1, height, width), _uint8)
        for i, raw in zip(hits, raws, strict=True):
            if raw and raw[::stride] == self.filters:
                images[i, 0] = np.frombuffer(raw, _uint8).reshape(height, stride)[:, 1:]
            else:
                misses.append(i)
        misses.sort()
        return images, labels, misses


def decode_png_record(value: bytes) -> tuple[np.ndarray, int] | None:
    """``(image, label)`` of a serialized Datum in the layout :mod:`mnist2db.formats.png.encoder`
    writes (``channels``, ``height``, ``width``, ``data`` a PNG, ``label`` below 128,
    ``encoded``), of any image size or kind, read without protobuf; None for any other
    record, or one whose PNG does not decode (the caller's general path then decodes it,
    or names what is wrong).

    The same image and label as protobuf and
    :func:`~mnist2db.formats.imdecode.png_decoder.decode_datum_image` give: the shape fields are not used
    (Caffe's data layer takes the decoded image's).
    """
    if len(value) < 64 or value[-2:] != b"\x38\x01" or value[-4] != 0x28 or value[-3] >= 0x80:
        return None
    start = value.find(PNG_SIGNATURE, 7, 40)
    if start < 0:
        return None
    size = len(value) - 4 - start
    length = (
        bytes((size,))
        if size < 0x80
        else bytes((size & 0x7F | 0x80, size >> 7))
        if size < 0x4000
        else None
    )
    if length is None or value[start - len(length) : start] != length:
        return None
    head = value[: start - len(length)]
    known = _RECORD_HEADS.get(head)
    if known is None:
        known = _shape_head_end(head) == len(head)
        if len(_RECORD_HEADS) >= HEADERS_MAX:
            _RECORD_HEADS.clear()
        _RECORD_HEADS[head] = known
    if not known:
        return None
    try:
        return decode_png(value[start:-4], ""), value[-3]
    except DatumError:
        return None


#: Record heads seen (the serialized ``channels``, ``height``, ``width`` fields and the tag
#: of ``data``) -> whether they are exactly that. Bounded.
_RECORD_HEADS: dict[bytes, bool] = {}
