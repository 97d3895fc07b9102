"""The IDX format: magics, header parsing and packing, compression sniffing, the image/label pair.

Reading the data (whole or in bounded batches) is :mod:`mnist2db.formats.idx_reader`'s.

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

import gzip
import io
import lzma
import os
import struct
import zlib

from mnist2db.errors import IdxFormatError
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any


class _IdxHeaderFields(NamedTuple):
    path: str
    type_code: int
    dims: tuple[int, ...]
    gzipped: bool
    xz: bool = False


__all__ = [
    "CORRUPT_ERRORS",
    "GZIP_MAGIC",
    "IDX_TYPES",
    "IMAGES_MAGIC",
    "INT32_MAX",
    "LABELS_MAGIC",
    "QMNIST_LABELS_MAGIC",
    "READ_CHUNK",
    "XZ_MAGIC",
    "IdxHeader",
    "check_pair",
    "corrupt_stream",
    "guarded_read",
    "magic_kind",
    "open_data",
    "open_raw",
    "open_xz",
    "pack_header",
    "parse_header",
    "size_error",
]

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
#: A Datum's height, width and data length are int32 fields.
INT32_MAX = (1 << 31) - 1

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
#: Errors a decompressor raises on a corrupt stream.
CORRUPT_ERRORS = (gzip.BadGzipFile, zlib.error, lzma.LZMAError, EOFError)
READ_CHUNK = 1 << 20


class IdxHeader(_IdxHeaderFields):
    """What an IDX header declares, and how the file holding it is stored (immutable).

    Fields: ``path``, ``type_code``, ``dims`` (a tuple), ``gzipped``, ``xz``.
    """

    __slots__ = ()

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


class _Prefixed(io.RawIOBase):
    """A stream that gives ``head`` first, then what ``raw`` holds: a look at the first
    bytes of a pipe without seeking back."""

    def __init__(self, head: bytes, raw: io.BufferedIOBase) -> None:
        super().__init__()
        self._head = head
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._raw.readinto(buffer)


def is_stream(raw: io.BufferedReader) -> bool:
    """True for what cannot be sized or sought: a pipe, a FIFO, a character device."""
    import stat

    return not stat.S_ISREG(os.fstat(raw.fileno()).st_mode)


def open_data(raw: io.BufferedReader, path: str) -> tuple[io.BufferedIOBase, str, bool]:
    """``(stream, packing, streaming)`` for an opened file: its (decompressed) bytes from the
    start, ``"gzip"``, ``"xz"`` or ``"plain"`` (by content), and whether it is a stream that
    cannot seek."""
    streaming = is_stream(raw)
    first = guarded_read(raw, len(XZ_MAGIC), path)
    if streaming:
        stream: io.BufferedIOBase = io.BufferedReader(_Prefixed(first, raw), READ_CHUNK)
    else:
        raw.seek(0)
        stream = raw
    if first[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb"), "gzip", streaming
    if first == XZ_MAGIC:
        return open_xz(stream), "xz", streaming
    return stream, "plain", streaming


def open_xz(stream: io.BufferedIOBase) -> io.BufferedIOBase:
    # LZMAFile reads its input a buffer at a time: memory stays bounded at any size.
    return lzma.LZMAFile(stream, mode="rb")  # type: ignore[arg-type]


def open_raw(path: str) -> io.BufferedReader:
    """Open ``path`` for binary reading; a failure is an IdxFormatError naming the file."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller owns and closes it
    except FileNotFoundError:
        raise IdxFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise IdxFormatError(f"{path}: is a directory, expected an IDX file") from None
    except PermissionError:
        raise IdxFormatError(f"{path}: permission denied") from None
    except OSError as exc:
        raise IdxFormatError(f"{path}: cannot open: {exc.strerror or exc}") from None


def _read_exactly(stream: io.BufferedIOBase, n: int, path: str, what: str) -> bytes:
    data = guarded_read(stream, n, path)
    if len(data) != n:
        raise IdxFormatError(
            f"{path}: truncated header: {what} needs {n} bytes, file has {len(data)}"
        )
    return data


def guarded_read(stream: io.BufferedIOBase, n: int, path: str) -> bytes:
    """Read up to ``n`` bytes, turning decompression faults into IdxFormatError."""
    try:
        return stream.read(n)
    except CORRUPT_ERRORS as exc:
        raise IdxFormatError(f"{path}: {corrupt_stream(stream)}: {exc}") from None
    except OSError as exc:
        raise IdxFormatError(f"{path}: read error: {exc.strerror or exc}") from None


def corrupt_stream(stream: object) -> str:
    """How a decompression fault is named: ``corrupt gzip stream`` or ``corrupt xz stream``."""
    return f"corrupt {'xz' if isinstance(stream, lzma.LZMAFile) else 'gzip'} stream"


def parse_header(stream: io.BufferedIOBase, path: str, packing: str) -> IdxHeader:
    """Read and check the magic and dimensions at the start of ``stream`` (sizes unchecked).

    Raises:
        IdxFormatError: bad magic, unknown type, a short header, or a corrupt gzip stream.
    """
    magic = _read_exactly(stream, 4, path, "the magic number")
    if magic[0] != 0 or magic[1] != 0:
        raise IdxFormatError(
            f"{path}: not an IDX file: magic 0x{magic.hex()}, expected 0x0000 then type and rank"
        )
    type_code, ndim = magic[2], magic[3]
    if type_code not in IDX_TYPES:
        raise IdxFormatError(
            f"{path}: magic 0x{magic.hex()} has unknown type code 0x{type_code:02x} "
            f"(known: {', '.join(f'0x{c:02x} {n}' for c, (n, _) in IDX_TYPES.items())})"
        )
    if ndim == 0:
        raise IdxFormatError(f"{path}: magic 0x{magic.hex()} declares 0 dimensions")
    raw_dims = _read_exactly(stream, 4 * ndim, path, f"{ndim} dimension sizes")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    return IdxHeader(
        path=path, type_code=type_code, dims=dims, gzipped=packing == "gzip", xz=packing == "xz"
    )


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
    (by the readers that pick a column: :mod:`mnist2db.recipe`).

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
