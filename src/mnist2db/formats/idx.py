"""The IDX format: types, magics, the header and its packing, the image/label pair rules.

Reading IDX bytes in every way (files, gzip, xz, pipes; whole, in batches, or measured) is
:mod:`mnist2db.formats.idx_reader`'s.

The IDX format: a big-endian header of two zero bytes, a type code, a dimension count, one
uint32 per dimension, then the data in C order. Every size is checked against the header
before memory is allocated for the data, and a file must hold exactly what the header
declares: neither less (truncated) nor more (trailing bytes). Compression is told by
content, not by name: gzip (``1f 8b``) and xz (``fd 37 7a 58 5a 00``, QMNIST's NIST files).

Pipes, FIFOs, ``/dev/stdin`` and process substitution (``<(zcat f.gz)``) are read as
streams, without seeking: their size is checked as the data arrives (a batch is held only
as far as data has actually arrived, and at most one chunk past the declared end is read).
"""

from __future__ import annotations

import struct

from mnist2db.errors import IdxFormatError
from mnist2db.fastpath import NamedTuple, named_tuple
from mnist2db.formats.datum import INT32_MAX

#: type code -> (name, numpy dtype string in the file's big-endian byte order)
IDX_TYPES: dict[int, tuple[str, str]] = {
    0x08: ("uint8", "u1"),
    0x09: ("int8", "i1"),
    0x0B: ("int16", ">i2"),
    0x0C: ("int32", ">i4"),
    0x0D: ("float32", ">f4"),
    0x0E: ("float64", ">f8"),
}

#: MNIST's uint8 images (3 dimensions) and uint8 labels (1 dimension).
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
#: QMNIST's int32 label rows (``idx2-int``: one row of label columns per item).
QMNIST_LABELS_MAGIC = 0x00000C02

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"


@named_tuple
class IdxHeader(NamedTuple):
    """What an IDX header declares, and how the file holding it is stored (immutable).

    Fields: ``path``, ``type_code``, ``dims`` (a tuple), ``gzipped``, ``xz``.
    """

    path: str
    type_code: int
    dims: tuple[int, ...]
    gzipped: bool
    xz: bool = False

    @property
    def packing(self) -> str:
        """``"gzip"``, ``"xz"`` or ``"plain"``."""
        return "gzip" if self.gzipped else "xz" if self.xz else "plain"

    @property
    def magic(self) -> int:
        return (self.type_code << 8) | len(self.dims)

    @property
    def type_name(self) -> str:
        return IDX_TYPES[self.type_code][0]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return int(IDX_TYPES[self.type_code][1][-1])

    @property
    def header_size(self) -> int:
        return 4 + 4 * len(self.dims)

    @property
    def count(self) -> int:  # type: ignore[override]  # hides tuple.count
        """Number of items along the first dimension."""
        return self.dims[0]

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self.dims[1:]

    @property
    def item_size(self) -> int:
        """Bytes per item (one image, one label)."""
        size = self.itemsize
        for d in self.dims[1:]:
            size *= d
        return size

    @property
    def payload_size(self) -> int:
        """Bytes of data the header declares."""
        return self.count * self.item_size

    def describe(self) -> str:
        """The declared shape as people write it: ``60000 × 28 × 28 uint8``."""
        return " × ".join(str(d) for d in self.dims) + " " + self.type_name


def size_error(header: IdxHeader, actual: int, at_least: bool = False) -> IdxFormatError:
    """The error for a file whose ``actual`` bytes of data differ from what ``header`` declares."""
    expected = header.payload_size
    fault = "truncated" if actual < expected else "trailing bytes"
    holds = f"at least {actual}" if at_least else str(actual)
    return IdxFormatError(
        f"{header.path}: {fault}: header declares {expected} bytes of data "
        f"({header.describe()}), file holds {holds}"
    )


def pack_header(magic: int, *dims: int) -> bytes:
    """The bytes of an IDX header: ``magic`` then one big-endian uint32 per dimension."""
    return struct.pack(f">{1 + len(dims)}I", magic, *dims)


def magic_kind(magic: int) -> str:
    """What a magic number means, as ``info`` names it."""
    if magic == IMAGES_MAGIC:
        return "MNIST images"
    if magic == LABELS_MAGIC:
        return "MNIST labels"
    if magic == QMNIST_LABELS_MAGIC:
        return "QMNIST label rows, idx2-int"
    return "IDX array"


def _wrong_magic(
    header: IdxHeader, expected: int, meaning: str, swapped: int, hint: str
) -> IdxFormatError:
    """The error for a file of the pair whose magic is not ``expected``, with ``hint`` when
    it holds the other file's magic (``swapped``)."""
    return IdxFormatError(
        f"{header.path}: magic 0x{header.magic:08x}, expected 0x{expected:08x} "
        f"({meaning}){hint if header.magic == swapped else ''}"
    )


def check_pair(images: IdxHeader, labels: IdxHeader, *, label_rows: bool = False) -> None:
    """Check that two IDX headers are an MNIST image file and its label file.

    ``label_rows``: QMNIST's int32 label rows (``idx2-int``, magic 0x0C02) are accepted too
    (by the readers that pick a column: :mod:`mnist2db.records`).

    Raises:
        IdxFormatError: wrong magic (with a hint when the two were swapped), or the item
            counts differ, or image dimensions that a Datum cannot hold.
    """
    if images.magic != IMAGES_MAGIC:
        raise _wrong_magic(
            images,
            IMAGES_MAGIC,
            "uint8 images, 3 dimensions",
            LABELS_MAGIC,
            " (is it the label file? the image file comes first)",
        )
    if label_rows and labels.magic == QMNIST_LABELS_MAGIC:
        if labels.dims[1] < 1:
            raise IdxFormatError(f"{labels.path}: idx2-int label rows of 0 columns hold no label")
    elif labels.magic != LABELS_MAGIC:
        raise _wrong_magic(
            labels,
            LABELS_MAGIC,
            "uint8 labels, 1 dimension",
            IMAGES_MAGIC,
            " (is it the image file? the label file comes second)",
        )
    if images.count != labels.count:
        raise IdxFormatError(
            f"{images.path}: {images.count} images, but {labels.path} has {labels.count} labels"
        )
    rows, cols = images.dims[1], images.dims[2]
    if rows > INT32_MAX or cols > INT32_MAX:
        # Datum's height and width are int32 (found by tests/test_fuzz.py: 2**31 × 0 images).
        raise IdxFormatError(
            f"{images.path}: images of {rows} × {cols} pixels do not fit a Datum "
            f"(height and width at most {INT32_MAX})"
        )
    if rows * cols > INT32_MAX:
        raise IdxFormatError(
            f"{images.path}: images of {rows} × {cols} pixels are too large for a Datum "
            f"(at most {INT32_MAX} bytes)"
        )
