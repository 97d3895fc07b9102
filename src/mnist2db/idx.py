"""Read and validate IDX files (plain, gzip or xz), in whole or in bounded batches.

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
from collections import namedtuple
from collections.abc import Iterator

from .errors import IdxFormatError

TYPE_CHECKING = False  # not typing's: see mnist2db/__init__.py
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    import numpy as np

    class _IdxHeaderFields(NamedTuple):
        path: str
        type_code: int
        dims: tuple[int, ...]
        gzipped: bool
        xz: bool = False

else:
    # A named tuple rather than a dataclass: importing dataclasses costs ~15 ms of start-up.
    _IdxHeaderFields = namedtuple(
        "_IdxHeaderFields", "path type_code dims gzipped xz", defaults=(False,)
    )

__all__ = [
    "IDX_TYPES",
    "IdxHeader",
    "IdxReader",
    "open_idx",
    "open_raw",
    "parse_header",
    "read_header",
    "read_idx",
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

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
#: Errors a decompressor raises on a corrupt stream.
_CORRUPT = (gzip.BadGzipFile, zlib.error, lzma.LZMAError, EOFError)
_READ_CHUNK = 1 << 20
#: Deflate's largest expansion (258 bytes from 2 bits), bounding what a gzip file can hold.
_MAX_DEFLATE_RATIO = 1032


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
    first = _guarded_read(raw, len(XZ_MAGIC), path)
    if streaming:
        stream: io.BufferedIOBase = io.BufferedReader(_Prefixed(first, raw), _READ_CHUNK)
    else:
        raw.seek(0)
        stream = raw
    if first[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb"), "gzip", streaming
    if first == XZ_MAGIC:
        return _open_xz(stream), "xz", streaming
    return stream, "plain", streaming


def _open_xz(stream: io.BufferedIOBase) -> io.BufferedIOBase:
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
    data = _guarded_read(stream, n, path)
    if len(data) != n:
        raise IdxFormatError(
            f"{path}: truncated header: {what} needs {n} bytes, file has {len(data)}"
        )
    return data


def _guarded_read(stream: io.BufferedIOBase, n: int, path: str) -> bytes:
    """Read up to ``n`` bytes, turning decompression faults into IdxFormatError."""
    try:
        return stream.read(n)
    except _CORRUPT as exc:
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


def _gzip_isize(raw: io.BufferedReader) -> int | None:
    """The gzip trailer's ISIZE (uncompressed size mod 2**32), or None if unreadable."""
    try:
        end = raw.seek(0, io.SEEK_END)
        if end < 18:
            return None
        raw.seek(end - 4)
        (isize,) = struct.unpack("<I", raw.read(4))
        raw.seek(0)
        return int(isize)
    except OSError:
        return None


class IdxReader:
    """An open IDX file whose header has been read and whose size has been checked.

    Use :func:`open_idx` to make one. Data is then read with :meth:`iter_batches`
    (bounded memory) or :meth:`read_all`. The size check happens before any data is
    read: for a plain file from its length, for a gzip file from its trailer and, when
    the trailer cannot settle it, by a counting pass that holds one chunk at a time.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._raw = open_raw(self.path)
        self._stream: io.BufferedIOBase = self._raw
        try:
            self._open()
        except BaseException:
            self._raw.close()
            raise

    def _open(self) -> None:
        path = self.path
        self._stream, packing, self.streaming = open_data(self._raw, path)
        self.header = parse_header(self._stream, path, packing)
        if self.streaming:
            return  # sizes are checked as the data arrives
        if packing == "gzip":
            self._check_gzip_size()
        elif packing == "xz":
            self._count_data()
        else:
            actual = os.fstat(self._raw.fileno()).st_size - self.header.header_size
            if actual != self.header.payload_size:
                raise size_error(self.header, actual)

    def _check_gzip_size(self) -> None:
        header = self.header
        expected_total = header.header_size + header.payload_size
        compressed = os.fstat(self._raw.fileno()).st_size
        most = _MAX_DEFLATE_RATIO * compressed + _READ_CHUNK
        if expected_total > most:
            # Deflate cannot expand more than ~1032:1: refuse a header that claims more
            # than the file could hold before reading (or allocating) anything.
            raise IdxFormatError(
                f"{header.path}: truncated: header declares {header.payload_size} bytes of data "
                f"({header.describe()}), a gzip file of {compressed} bytes holds at most {most}"
            )
        isize = _gzip_isize(self._raw)
        # ISIZE is the length modulo 2**32, so it settles nothing for longer streams.
        if isize == expected_total and expected_total < (1 << 32):
            # Likely right; iter_batches still verifies the exact length as it streams.
            self._reopen_after_header()
            return
        # The trailer disagrees (or the file is multi-member): count the real length.
        self._reopen_after_header()
        self._count_data()

    def _count_data(self) -> None:
        """Count the data after the header, reading at most the declared size plus one chunk
        and holding one chunk at a time (a decompression bomb stops there), then start over
        just after the header."""
        header = self.header
        actual = 0
        limit = header.payload_size + _READ_CHUNK
        while actual < limit:
            chunk = _guarded_read(self._stream, min(_READ_CHUNK, limit - actual), self.path)
            if not chunk:
                break
            actual += len(chunk)
        if actual != header.payload_size:
            raise size_error(header, actual, at_least=actual >= limit)
        self._reopen_after_header()

    def _reopen_after_header(self) -> None:
        self._raw.seek(0)
        if self.header.xz:
            self._stream = _open_xz(self._raw)
        else:
            self._stream = gzip.GzipFile(fileobj=self._raw, mode="rb")
        _guarded_read(self._stream, self.header.header_size, self.path)

    # -- reading -------------------------------------------------------------------

    def _fill(self, array: np.ndarray, done_before: int) -> None:
        """Fill ``array`` from the stream; a short read is a truncation error."""
        if array.nbytes == 0:
            return
        self._fill_view(memoryview(array).cast("B"), done_before)  # type: ignore[arg-type]

    def _fill_view(self, buffer: memoryview, done_before: int) -> None:
        """Fill the byte view ``buffer`` from the stream; a short read is a truncation error."""
        filled = 0
        total = len(buffer)
        while filled < total:
            try:
                n = self._stream.readinto(buffer[filled:])
            except _CORRUPT as exc:
                raise IdxFormatError(
                    f"{self.path}: {corrupt_stream(self._stream)}: {exc}"
                ) from None
            except OSError as exc:
                raise IdxFormatError(f"{self.path}: read error: {exc.strerror or exc}") from None
            if not n:
                raise size_error(self.header, done_before + filled)
            filled += n

    def _read_arriving(self, size: int, done_before: int) -> bytearray:
        """Read ``size`` bytes from a stream, holding only what has arrived (a header may
        promise more than a pipe delivers); a short read is a truncation error."""
        data = bytearray()
        while len(data) < size:
            chunk = _guarded_read(self._stream, min(_READ_CHUNK, size - len(data)), self.path)
            if not chunk:
                raise size_error(self.header, done_before + len(data))
            data += chunk
        return data

    def _check_end(self) -> None:
        extra = _guarded_read(self._stream, _READ_CHUNK, self.path)
        if extra:
            # Bounded: one chunk past the end is enough to tell; beyond it, say "at least".
            raise size_error(
                self.header,
                self.header.payload_size + len(extra),
                at_least=len(extra) == _READ_CHUNK,
            )

    def iter_batches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Yield arrays of up to ``batch_size`` items, shape ``(n, *item_shape)``, in file order.

        The arrays are in the file's own (big-endian) dtype; values are right either way.

        Raises:
            IdxFormatError: the data ends early, continues past the declared size, or a
                gzip stream is corrupt.
        """
        import numpy as np

        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        header = self.header
        dtype = np.dtype(IDX_TYPES[header.type_code][1])
        done = 0
        while done < header.count:
            n = min(batch_size, header.count - done)
            if self.streaming:
                data = self._read_arriving(n * header.item_size, done * header.item_size)
                done += n
                yield np.frombuffer(data, dtype=dtype).reshape(n, *header.item_shape)
                continue
            try:
                batch = np.empty((n, *header.item_shape), dtype=dtype)
            except (MemoryError, ValueError) as exc:
                raise IdxFormatError(
                    f"{self.path}: cannot hold {n * header.item_size} bytes in memory ({exc})"
                ) from None
            self._fill(batch, done * header.item_size)
            done += n
            yield batch
        self._check_end()

    def iter_raw_batches(self, batch_size: int) -> Iterator[memoryview]:
        """Yield the raw bytes of up to ``batch_size`` items at a time, in file order.

        The fast path of the converter: no numpy, one buffer reused for every batch, so each
        yielded view is only valid until the next one is requested. Item ``i`` of a batch is
        ``view[i * item_size : (i + 1) * item_size]``, in the file's byte order.

        Raises:
            IdxFormatError: as :meth:`iter_batches`.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        header = self.header
        item_size = header.item_size
        done = 0
        if self.streaming:
            while done < header.count:
                n = min(batch_size, header.count - done)
                data = self._read_arriving(n * item_size, done * item_size)
                done += n
                yield memoryview(data)
            self._check_end()
            return
        buffer = memoryview(bytearray(min(batch_size, header.count) * item_size))
        while done < header.count:
            n = min(batch_size, header.count - done)
            view = buffer[: n * item_size]
            if n * item_size:
                self._fill_view(view, done * item_size)
            done += n
            yield view
        self._check_end()

    def read_all(self) -> np.ndarray:
        """The whole array, in native byte order."""
        import numpy as np

        header = self.header
        dtype = np.dtype(IDX_TYPES[header.type_code][1])
        if self.streaming:
            arrived = self._read_arriving(header.payload_size, 0)
            self._check_end()
            whole = np.frombuffer(arrived, dtype=dtype).reshape(header.dims)
            return whole.astype(dtype.newbyteorder("="), copy=False)
        try:
            data = np.empty(header.dims, dtype=dtype)
        except (MemoryError, ValueError) as exc:
            raise IdxFormatError(
                f"{self.path}: cannot hold {header.payload_size} bytes in memory ({exc})"
            ) from None
        self._fill(data, 0)
        self._check_end()
        return data.astype(dtype.newbyteorder("="), copy=False)

    def close(self) -> None:
        if self._stream is not self._raw:
            self._stream.close()
        self._raw.close()

    def __enter__(self) -> IdxReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_idx(path: str | os.PathLike[str]) -> IdxReader:
    """Open an IDX file, read its header and check its size against the header.

    Raises:
        IdxFormatError: missing or unreadable file, bad magic, unknown type, or a size
            that differs from what the header declares.
    """
    return IdxReader(path)


def read_header(path: str | os.PathLike[str]) -> IdxHeader:
    """Read and validate an IDX header (sizes included) without reading the data."""
    with open_idx(path) as reader:
        return reader.header


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a whole IDX file (plain, gzip or xz, detected by content) into a numpy array.

    Returns:
        An array of shape ``dims`` in native byte order (``uint8`` for MNIST).

    Raises:
        IdxFormatError: see :func:`open_idx`; also a truncated or corrupt gzip stream.
    """
    with open_idx(path) as reader:
        return reader.read_all()
