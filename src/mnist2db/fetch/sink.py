"""Where fetched bytes go: hashed, unpacked (gzip or xz) and written in one streaming pass.

A :class:`DownloadSink` takes a source's bytes in order, hashes them, unpacks them and writes
them to :class:`~mnist2db.storage.files.AtomicFile` temporaries beside the destination; nothing
reaches a final name until :meth:`DownloadSink.finish` has matched a published digest. The
source side (HTTP, a directory, an archive member) only calls :meth:`~DownloadSink.feed`.

The three exceptions below are signals between a source and the fetch loop, never shown as
they are: the loop turns them into one :class:`~mnist2db.errors.DownloadError` line listing
every source with its reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import IO, Any

from mnist2db.fetch.catalog import PACKING_SUFFIX, Resource
from mnist2db.fetch.failures import Rejected
from mnist2db.formats.idx.header import GZIP_MAGIC, IDX_TYPES, XZ_MAGIC
from mnist2db.storage.files import AtomicFile, remove_stale, temp_prefix
from mnist2db.untrusted import clean

CHUNK = 1 << 16
UNPACK_CHUNK = 1 << 20
# The bounds on what one source may make us write or hold (docs/fetching.md explains them).
#: An unpacked MNIST-format file is under 600 MB (EMNIST byclass: 547 MB); an IDX header
#: declaring more is not one of them.
MAX_UNPACKED = 1 << 30
#: A file of the dataset that is not IDX (EMNIST's class mappings: under 1 kB).
MAX_TEXT = 1 << 20
#: Packed bytes that may arrive before the IDX header has come out of them: a real stream
#: yields it within its first few hundred bytes; an endless run of empty blocks never does.
HEADER_WINDOW = 1 << 20
#: xz's memory limit: enough for any preset up to xz -9 (64 MiB dictionary), far below what
#: a hostile block header may ask for (a 1.5 GiB dictionary).
XZ_MEMLIMIT = 128 << 20
#: What each packing starts with (a zip archive is kept as it is, not unpacked).
_MAGIC = {"gzip": GZIP_MAGIC, "xz": XZ_MAGIC, "zip": b"PK\x03\x04"}
_NAMES = {"gzip": "gzip", "xz": "xz", "zip": "a zip archive"}
#: Digest algorithms from the weakest to the strongest: the strongest match is reported.
STRENGTH = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")


def packed_bound(unpacked: int) -> int:
    """The most bytes a gzip or xz stream of ``unpacked`` bytes can take: stored blocks
    cost 5 bytes per 64 KiB, xz's uncompressed chunks 3 per 64 KiB; 1/256 and 1 MiB of
    headroom cover several members or streams and their headers."""
    return unpacked + unpacked // 256 + (1 << 20)


#: The longest IDX header: the magic and 255 dimensions.
IDX_HEAD_MAX = 4 + 4 * 255


def declared_size(head: bytes) -> int | None:
    """The file size an IDX header declares, from the file's first bytes; None while
    ``head`` is too short to tell.

    Raises:
        ValueError: ``head`` does not start an IDX file (the message says how it starts).
    """
    if len(head) < 4:
        return None
    if head[:2] != b"\0\0" or head[2] not in IDX_TYPES or head[3] == 0:
        raise ValueError(f"not an IDX file (it starts with {head[:4].hex()})")
    rank = head[3]
    if len(head) < 4 + 4 * rank:
        return None
    size = int(IDX_TYPES[head[2]][1][-1])
    for dim in struct.unpack(f">{rank}I", head[4 : 4 + 4 * rank]):
        size *= dim
    return 4 + 4 * rank + size


def hashers(algorithms: Iterable[str]) -> dict[str, Any]:
    return {name: hashlib.new(name) for name in sorted(set(algorithms))}


def handle_digests(handle: IO[bytes], algorithms: Iterable[str]) -> dict[str, str]:
    """The digests of what ``handle`` holds from its current position to its end."""
    found = hashers(algorithms)
    while chunk := handle.read(UNPACK_CHUNK):
        for hasher in found.values():
            hasher.update(chunk)
    return {name: h.hexdigest() for name, h in found.items()}


def _unpacker(packing: str) -> Any:
    if packing == "xz":
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
    return zlib.decompressobj(wbits=31)


def _corrupt_errors(packing: str) -> tuple[type[Exception], ...]:
    """What the unpacker raises for damaged data (anything else is not the source's fault)."""
    if packing == "xz":
        return (lzma.LZMAError, EOFError)
    return (zlib.error,)


class DownloadSink:
    """Takes a source's bytes in order: hashes them, unpacks them, writes temp files.

    The unpacked bytes go to an :class:`AtomicFile` for ``final``; the packed bytes to a
    second one for ``final`` plus the packing's suffix when ``keep_packed``. ``packing`` is
    ``"gzip"``, ``"xz"``, ``"none"`` (the bytes are the file) or ``"zip"`` (the bytes are the
    file, which must be a zip archive). :meth:`reset` starts over (a server that ignored
    ``Range``); :meth:`place` commits both; :meth:`discard` removes what is left.

    Bounded, whatever the source sends: an IDX file stops at the size its header declares
    (at most :data:`MAX_UNPACKED`), another file at :data:`MAX_TEXT`, a zip archive at its
    published size, the packed bytes at :func:`packed_bound` of the unpacked size (and
    :data:`HEADER_WINDOW` until the header is out), xz's memory at :data:`XZ_MEMLIMIT`.
    Overrunning a bound is the source's fault (:class:`Rejected`): the next one is tried.

    Raises:
        OSError: a temporary file cannot be created.
    """

    def __init__(self, final: str, resource: Resource, *, packing: str, keep_packed: bool) -> None:
        self.final = final
        self.resource = resource
        self.packing = packing
        self.unpacks = packing in ("gzip", "xz")
        directory = os.path.dirname(final) or "."
        # Temporaries of killed fetches of this file are recognised by name and removed
        # (the packed one carries the packing's suffix).
        suffix = PACKING_SUFFIX.get(packing, "")
        remove_stale(
            directory,
            temp_prefix(os.path.basename(final)),
            directories=False,
            extensions=(".gz", ".xz"),
        )
        self.raw = AtomicFile(final).create()
        self.packed: AtomicFile | None = None
        try:
            if self.unpacks and keep_packed:
                self.packed = AtomicFile(final + suffix).create()
        except BaseException:
            self.raw.discard()
            raise
        self.resets = -1  # reset() counts the restarts after this first one
        self.reset()

    def reset(self) -> None:
        """Forget everything received so far."""
        self.resets += 1
        packed_algos = ["sha256", *self.resource.gz] if self.unpacks else []
        self.packed_hashers = hashers(packed_algos)
        self.raw_hashers = hashers(["sha256", *self.resource.unpacked])
        self.received = 0
        self.unpacked = 0
        self.raw_sha256 = ""
        self.packed_sha256: str | None = None
        self._unpacker: Any = _unpacker(self.packing) if self.unpacks else None
        self._corrupt = _corrupt_errors(self.packing)
        self._padding: int | None = None  # xz: zero bytes after a stream (None: inside one)
        self._head = b""  # the unpacked bytes until the IDX header is complete
        self.declared: int | None = None  # the file size the IDX header declares
        for target in (self.raw, self.packed):
            if target is not None:
                target.stream.seek(0)
                target.stream.truncate()

    # -- the bounds ----------------------------------------------------------------------

    def _unpacked_limit(self) -> int:
        if self.packing == "zip":
            return self.resource.size or MAX_UNPACKED
        if not self.resource.idx:
            return MAX_TEXT
        return self.declared if self.declared is not None else MAX_UNPACKED

    def _packed_limit(self, announced: bool = False) -> tuple[int, str]:
        """The most packed bytes this source may send, and why (for the message).
        ``announced``: for a length promised up front, before any header is out."""
        if not self.unpacks:
            limit = self._unpacked_limit()
            if self.packing == "zip":
                return limit, f"{self.resource.name} is published as {limit} bytes"
            if self.declared is not None:
                return limit, f"the {limit} bytes its IDX header declares"
            return limit, f"the {limit} bytes a file of this dataset can be"
        if self.resource.size and not self.resource.unpacked:
            # Only the published packed file can match: exactly its published size.
            size = self.resource.size
            return size, f"{self.resource.remote} is published as {size} bytes"
        if self.resource.idx and self.declared is None and not announced:
            return HEADER_WINDOW, "without unpacking to an IDX header"
        limit = packed_bound(self._unpacked_limit())
        return limit, f"more than a packed file of {self._unpacked_limit()} bytes can take"

    def announce(self, length: int) -> None:
        """The source promises ``length`` bytes in all (Content-Length, a local file's
        size): refused at once when past the bound, before any byte is read."""
        limit, why = self._packed_limit(announced=True)
        if length > limit:
            raise Rejected(f"{length} bytes announced, {why}")

    def _check_packed(self) -> None:
        limit, why = self._packed_limit()
        if self.received > limit:
            raise Rejected(f"more than {limit} bytes, {why}")

    # -- the bytes ------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes. Raises :class:`Rejected` for bytes that cannot be the file,
        ``OSError`` when the temporary cannot be written."""
        magic = _MAGIC.get(self.packing)
        if magic and self.received == 0 and chunk[: len(magic)] != magic[: len(chunk)]:
            what = _NAMES[self.packing]
            raise Rejected(f"not {what} data (it starts with {_preview(chunk)})")
        self.received += len(chunk)
        self._check_packed()
        for hasher in self.packed_hashers.values():
            hasher.update(chunk)
        if self.packed is not None:
            self.packed.stream.write(chunk)
        if self.unpacks:
            self._unpack(chunk)
        else:
            self._write(chunk)

    def _unpack(self, data: bytes) -> None:
        try:
            while data:
                if self._padding is not None:
                    # Between xz streams: stream padding (zero bytes, a multiple of 4),
                    # then possibly another stream.
                    rest = data.lstrip(b"\0")
                    self._padding += len(data) - len(rest)
                    if not rest:
                        return
                    self._check_padding()
                    self._padding = None
                    self._unpacker = _unpacker(self.packing)
                    data = rest
                elif self._unpacker.eof:
                    # A gzip file may hold several members (an xz file several streams).
                    if self.packing == "xz":
                        self._padding = 0
                        continue
                    self._unpacker = _unpacker(self.packing)
                self._write(self._unpacker.decompress(data, UNPACK_CHUNK))
                data = self._pending()
        except self._corrupt as exc:
            raise self._damage(exc, f" at byte {self.received}") from None

    def _check_padding(self) -> None:
        if self._padding is not None and self._padding % 4:
            raise Rejected(f"xz stream padding of {self._padding} bytes, not a multiple of 4")

    def _damage(self, exc: Exception, where: str = "") -> Rejected:
        if "Memory usage limit" in str(exc):
            return Rejected(f"xz data needs more than {XZ_MEMLIMIT >> 20} MiB of memory to unpack")
        return Rejected(f"corrupt {self.packing} data{where} ({clean(exc)})")

    def _pending(self) -> bytes:
        """Input the unpacker has not consumed yet."""
        unpacker = self._unpacker
        if unpacker.eof:
            return bytes(unpacker.unused_data)
        if self.packing == "xz":
            return b""  # LZMADecompressor buffers its input itself (needs_input)
        return bytes(unpacker.unconsumed_tail)

    def _drain(self) -> None:
        """Unpack what the decompressor still holds (output was capped per call)."""
        unpacker = self._unpacker
        if self._padding is not None:
            return
        if self.packing == "xz":
            while not unpacker.eof and not unpacker.needs_input:
                self._write(unpacker.decompress(b"", UNPACK_CHUNK))
        else:
            while not unpacker.eof and unpacker.unconsumed_tail:
                self._write(unpacker.decompress(unpacker.unconsumed_tail, UNPACK_CHUNK))

    def _write(self, data: bytes) -> None:
        if self.declared is None and self.resource.idx and self.packing != "zip" and data:
            self._read_header(data)
        self.unpacked += len(data)
        limit = self._unpacked_limit()
        if self.unpacked > limit:
            if self.declared is not None:
                raise Rejected(f"unpacks past the {limit} bytes its IDX header declares")
            if self.packing == "zip":
                raise Rejected(f"more than {limit} bytes, {self.resource.name} is published so")
            raise Rejected(f"more than {limit} bytes; not {self.resource.name}")
        for hasher in self.raw_hashers.values():
            hasher.update(data)
        self.raw.stream.write(data)

    def _read_header(self, data: bytes) -> None:
        """Learn the file's size from its IDX header as soon as its bytes are out."""
        head = self._head = (self._head + data)[:IDX_HEAD_MAX]
        try:
            declared = declared_size(head)
        except ValueError as exc:
            raise Rejected(str(exc)) from None
        if declared is None:
            return
        if declared > MAX_UNPACKED:
            rank = head[3]
            shape = " x ".join(map(str, struct.unpack(f">{rank}I", head[4 : 4 + 4 * rank])))
            raise Rejected(
                f"its IDX header declares {declared} bytes ({shape}), more than the "
                f"{MAX_UNPACKED} bytes an MNIST-format file can be"
            )
        self.declared = declared
        self._head = b""
        self._check_packed()

    def finish(self, vouched: str | None = None) -> str:
        """Check the stream is complete and matches a published digest; returns which one.

        ``vouched``: what verified these bytes already (the archive they came from), used
        when the resource publishes no digest of its own.
        """
        if self.unpacks:
            if self.received == 0:
                raise Rejected("empty response")
            try:
                self._drain()
            except self._corrupt as exc:
                raise self._damage(exc) from None
            self._check_padding()
            if self._padding is None and not self._unpacker.eof:
                raise Rejected(f"{self.packing} data ends early (after {self.received} bytes)")
        if self.declared is not None and self.unpacked != self.declared:
            raise Rejected(f"{self.unpacked} bytes, where its IDX header declares {self.declared}")
        if self.resource.idx and self.packing != "zip" and self.declared is None:
            raise Rejected(f"{self.unpacked} bytes: too short for an IDX header")
        packed = {name: h.hexdigest() for name, h in self.packed_hashers.items()}
        raw = {name: h.hexdigest() for name, h in self.raw_hashers.items()}
        self.raw_sha256 = raw["sha256"]
        self.packed_sha256 = packed.get("sha256")
        if vouched is not None and not self.resource.gz and not self.resource.unpacked:
            return vouched
        return match(self.resource, packed, raw)

    def place(self, keep_open: bool = False) -> IO[bytes] | None:
        """fsync the verified temp files and move them to their final names.

        ``keep_open``: return a handle on the placed unpacked file, opened before the
        rename: what is read through it is what was hashed, whatever is renamed over
        the final name afterwards.
        """
        handle = None
        if keep_open:
            # The temporary is opened again for reading, and proven to be the file written
            # (same device and inode) before the rename: a file renamed over its name
            # meanwhile is refused, one renamed over the final name later is never read.
            handle = open(self.raw.temp, "rb")  # noqa: SIM115 - returned open
            written, opened = os.fstat(self.raw.stream.fileno()), os.fstat(handle.fileno())
            if (written.st_dev, written.st_ino) != (opened.st_dev, opened.st_ino):
                handle.close()
                raise Rejected(f"{self.raw.temp}: replaced while it was being written")
        try:
            self.raw.commit()
            if self.packed is not None:
                self.packed.commit()
        except BaseException:
            if handle is not None:
                handle.close()
            raise
        if handle is not None:
            handle.seek(0)
        return handle

    def discard(self) -> None:
        """Remove every temporary not placed."""
        for target in (self.raw, self.packed):
            if target is not None:
                try:
                    target.discard()
                except OSError:
                    # Closing flushed the buffer into a full disk and raised before the
                    # temporary was removed; the stream is closed now, so again removes it.
                    with contextlib.suppress(OSError):
                        target.discard()


def strongest(algorithms: Iterable[str]) -> int:
    """The rank of the strongest of ``algorithms`` in :data:`STRENGTH` (-1: none known)."""
    return max((STRENGTH.index(a) for a in algorithms if a in STRENGTH), default=-1)


def match(resource: Resource, packed: Mapping[str, str], raw: Mapping[str, str]) -> str:
    """Which published digest matches (the strongest); raises :class:`Rejected` listing
    both sides if none.

    A side (the packed file, the unpacked one) matches when every digest published for it
    does: an md5 that matches where a sha256 published beside it does not is a mismatch.
    """
    suffix = PACKING_SUFFIX.get(resource.packing) or ".gz"
    if resource.packing == "zip":
        suffix = resource.name  # "gzip.zip md5": the archive is kept as it is
    unpacked = suffix if resource.packing == "zip" else "unpacked"
    sides = ((suffix, resource.gz, packed), (unpacked, resource.unpacked, raw))
    best: tuple[int, str] | None = None
    for kind, published, actual in sides:
        if published and all(actual.get(a) == d.lower() for a, d in published.items()):
            rank = strongest(published)
            name = max(published, key=lambda a: STRENGTH.index(a) if a in STRENGTH else -1)
            if best is None or rank > best[0]:
                best = (rank, f"{kind} {name}")
    if best is not None:
        return best[1]
    expected_text = " or ".join(
        [f"{suffix} {a} {d}" for a, d in resource.gz.items()]
        + [f"{unpacked} {a} {d}" for a, d in resource.unpacked.items()]
    )
    actual_text = ", ".join(
        [f"{suffix} {a} {packed[a]}" for a in resource.gz if a in packed]
        + [f"{unpacked} {a} {raw[a]}" for a in resource.unpacked if a in raw]
    )
    if not expected_text:
        raise Rejected("no published digest to check it against")
    if not actual_text:
        # An unpacked file offered where only packed digests are published.
        actual_text = f"unpacked sha256 {raw['sha256']}"
    raise Rejected(f"checksum mismatch: got {actual_text}; expected {expected_text}")


def _preview(chunk: bytes) -> str:
    text = chunk[:16]
    hint = "; an HTML error page?" if chunk.lstrip()[:1] == b"<" else ""
    return f"{text!r}{hint}"
