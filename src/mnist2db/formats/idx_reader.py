"""Read IDX files (plain, gzip or xz), in whole or in bounded batches, sizes checked first.

Every size is checked against the header before memory is allocated for the data, and a
file must hold exactly what the header declares: neither less (truncated) nor more
(trailing bytes). Compression is told by content, not by name: gzip and xz. Pipes, FIFOs,
``/dev/stdin`` and process substitution are read as streams, without seeking. Every way of
opening and reading IDX bytes is here (:func:`open_raw`, :func:`open_data`,
:func:`parse_header`; :mod:`mnist2db.formats.idx_scan` measures a file with them); the format
itself is :mod:`mnist2db.formats.idx`'s.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import struct
import zlib
from collections.abc import Iterator

from mnist2db.errors import ArgumentError, IdxFormatError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.deflate import INFLATE_RATIO
from mnist2db.formats.idx import (
    GZIP_MAGIC,
    IDX_TYPES,
    XZ_MAGIC,
    IdxHeader,
    size_error,
)

if TYPE_CHECKING:
    from typing import Any

    import numpy as np

#: What a damaged gzip or xz stream raises while it is read.
CORRUPT_ERRORS = (gzip.BadGzipFile, zlib.error, lzma.LZMAError, EOFError)
#: Bytes read at a time from a file or a pipe.
READ_CHUNK = 1 << 20


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
        most = INFLATE_RATIO * compressed + READ_CHUNK
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
        limit = header.payload_size + READ_CHUNK
        while actual < limit:
            chunk = guarded_read(self._stream, min(READ_CHUNK, limit - actual), self.path)
            if not chunk:
                break
            actual += len(chunk)
        if actual != header.payload_size:
            raise size_error(header, actual, at_least=actual >= limit)
        self._reopen_after_header()

    def _reopen_after_header(self) -> None:
        self._raw.seek(0)
        if self.header.xz:
            self._stream = open_xz(self._raw)
        else:
            self._stream = gzip.GzipFile(fileobj=self._raw, mode="rb")
        guarded_read(self._stream, self.header.header_size, self.path)

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
            except CORRUPT_ERRORS as exc:
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
            chunk = guarded_read(self._stream, min(READ_CHUNK, size - len(data)), self.path)
            if not chunk:
                raise size_error(self.header, done_before + len(data))
            data += chunk
        return data

    def _check_end(self) -> None:
        extra = guarded_read(self._stream, READ_CHUNK, self.path)
        if extra:
            # Bounded: one chunk past the end is enough to tell; beyond it, say "at least".
            raise size_error(
                self.header,
                self.header.payload_size + len(extra),
                at_least=len(extra) == READ_CHUNK,
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
            raise ArgumentError("batch_size must be at least 1")
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
            raise ArgumentError("batch_size must be at least 1")
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
