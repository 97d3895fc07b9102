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
import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from mnist2db.fetch.catalog import PACKING_SUFFIX, Resource
from mnist2db.formats.idx import GZIP_MAGIC, XZ_MAGIC
from mnist2db.storage.files import AtomicFile, remove_stale, temp_prefix

CHUNK = 1 << 16
UNPACK_CHUNK = 1 << 20
# An unpacked MNIST-format file is under 600 MB (EMNIST byclass: 547 MB); anything far
# beyond is not one of them (and a decompression bomb must not fill the disk).
MAX_UNPACKED = 1 << 30

#: What each packing starts with (a zip archive is kept as it is, not unpacked).
_MAGIC = {"gzip": GZIP_MAGIC, "xz": XZ_MAGIC, "zip": b"PK\x03\x04"}
_NAMES = {"gzip": "gzip", "xz": "xz", "zip": "a zip archive"}


class SourceFailed(Exception):
    """This source cannot deliver the file; the reason goes into the final error line."""


class Transient(SourceFailed):
    """Worth retrying on the same source (connection cut, timeout, 5xx)."""


class Rejected(SourceFailed):
    """Delivered, but the bytes are not the file (no digest matches, damaged packing)."""


def hashers(algorithms: Iterable[str]) -> dict[str, Any]:
    return {name: hashlib.new(name) for name in sorted(set(algorithms))}


def file_digests(path: str, algorithms: Iterable[str]) -> dict[str, str] | None:
    """The file's digests by algorithm, or None when it cannot be read."""
    found = hashers(algorithms)
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(UNPACK_CHUNK):
                for hasher in found.values():
                    hasher.update(chunk)
    except OSError:
        return None
    return {name: h.hexdigest() for name, h in found.items()}


def _unpacker(packing: str) -> Any:
    if packing == "xz":
        import lzma  # only for the xz files (QMNIST's NIST extension)

        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    return zlib.decompressobj(wbits=31)


def _corrupt_errors(packing: str) -> tuple[type[Exception], ...]:
    """What the unpacker raises for damaged data (anything else is not the source's fault)."""
    if packing == "xz":
        import lzma

        return (lzma.LZMAError, EOFError)
    return (zlib.error,)


class DownloadSink:
    """Takes a source's bytes in order: hashes them, unpacks them, writes temp files.

    The unpacked bytes go to an :class:`AtomicFile` for ``final``; the packed bytes to a
    second one for ``final`` plus the packing's suffix when ``keep_packed``. ``packing`` is
    ``"gzip"``, ``"xz"``, ``"none"`` (the bytes are the file) or ``"zip"`` (the bytes are the
    file, which must be a zip archive). :meth:`reset` starts over (a server that ignored
    ``Range``); :meth:`place` commits both; :meth:`discard` removes what is left.

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
        self.reset()

    def reset(self) -> None:
        """Forget everything received so far."""
        packed_algos = ["sha256", *self.resource.gz] if self.unpacks else []
        self.packed_hashers = hashers(packed_algos)
        self.raw_hashers = hashers(["sha256", *self.resource.unpacked])
        self.received = 0
        self.unpacked = 0
        self.raw_sha256 = ""
        self.packed_sha256: str | None = None
        self._unpacker: Any = _unpacker(self.packing) if self.unpacks else None
        self._corrupt = _corrupt_errors(self.packing)
        for target in (self.raw, self.packed):
            if target is not None:
                target.stream.seek(0)
                target.stream.truncate()

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes. Raises :class:`Rejected` for bytes that cannot be the file,
        ``OSError`` when the temporary cannot be written."""
        magic = _MAGIC.get(self.packing)
        if magic and self.received == 0 and chunk[: len(magic)] != magic[: len(chunk)]:
            what = _NAMES[self.packing]
            raise Rejected(f"not {what} data (it starts with {_preview(chunk)})")
        self.received += len(chunk)
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
                if self._unpacker.eof:
                    # A gzip file may hold several members (an xz file several streams).
                    self._unpacker = _unpacker(self.packing)
                    if self.packing == "xz" and not data.strip(b"\0"):
                        return  # stream padding
                self._write(self._unpacker.decompress(data, UNPACK_CHUNK))
                data = self._pending()
        except self._corrupt as exc:
            raise Rejected(f"corrupt {self.packing} data at byte {self.received} ({exc})") from None

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
        if self.packing == "xz":
            while not unpacker.eof and not unpacker.needs_input:
                self._write(unpacker.decompress(b"", UNPACK_CHUNK))
        else:
            while not unpacker.eof and unpacker.unconsumed_tail:
                self._write(unpacker.decompress(unpacker.unconsumed_tail, UNPACK_CHUNK))

    def _write(self, data: bytes) -> None:
        self.unpacked += len(data)
        if self.packing == "zip":
            # An archive kept as it is: bounded by twice its published size, so an endless
            # answer cannot fill the disk (EMNIST's is 536 MiB, under the IDX cap anyway).
            limit = max(MAX_UNPACKED, 2 * (self.resource.size or 0))
            if self.unpacked > limit:
                raise Rejected(f"more than {limit} bytes; not {self.resource.name}")
        elif self.unpacked > MAX_UNPACKED:
            raise Rejected(f"unpacks to more than {MAX_UNPACKED} bytes; not an IDX file")
        for hasher in self.raw_hashers.values():
            hasher.update(data)
        self.raw.stream.write(data)

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
                raise Rejected(f"corrupt {self.packing} data ({exc})") from None
            if not self._unpacker.eof:
                raise Rejected(f"{self.packing} data ends early (after {self.received} bytes)")
        packed = {name: h.hexdigest() for name, h in self.packed_hashers.items()}
        raw = {name: h.hexdigest() for name, h in self.raw_hashers.items()}
        self.raw_sha256 = raw["sha256"]
        self.packed_sha256 = packed.get("sha256")
        if vouched is not None and not self.resource.gz and not self.resource.unpacked:
            return vouched
        return match(self.resource, packed, raw)

    def place(self) -> None:
        """fsync the verified temp files and move them to their final names."""
        self.raw.commit()
        if self.packed is not None:
            self.packed.commit()

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


def match(resource: Resource, packed: Mapping[str, str], raw: Mapping[str, str]) -> str:
    """Which published digest matches; raises :class:`Rejected` listing both sides if none."""
    suffix = PACKING_SUFFIX.get(resource.packing) or ".gz"
    if resource.packing == "zip":
        suffix = resource.name  # "gzip.zip md5": the archive is kept as it is
    unpacked = suffix if resource.packing == "zip" else "unpacked"
    sides = (("packed", resource.gz, packed), (unpacked, resource.unpacked, raw))
    for kind, published, actual in sides:
        for algorithm, expected in published.items():
            if actual.get(algorithm) == expected.lower():
                return f"{suffix if kind == 'packed' else kind} {algorithm}"
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
