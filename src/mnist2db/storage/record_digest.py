"""The digest of a database's records: what ``verify DB`` compares to find a changed byte.

The one batch writer (:func:`mnist2db.conversion.write_database`) computes it as it
writes, a batch at a time on a thread beside the writer; ``verify`` computes it again from
the records read back. :mod:`mnist2db.storage.metadata` records it in ``mnist2db.json``
(``digest``). LMDB keeps no checksum of its own.
"""

from __future__ import annotations

from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

#: How the records' digest is computed (recorded with it): the digest of Caffe's own
#: outputs in the byte-identity tests too (tests/test_fashion.py).
DIGEST_METHOD = (
    "sha256 over each record in key order: 4-byte big-endian key length, key, "
    "4-byte big-endian value length, value"
)


class FramedItems(list):  # type: ignore[type-arg]
    """A batch of ``(key, value)`` records with their framing for the digest, when known:
    ``framed``, buffers whose bytes in order are the batch's records framed as
    :data:`DIGEST_METHOD` frames them (one update each, nothing framed again), or None."""

    __slots__ = ("framed",)

    def __init__(self) -> None:
        super().__init__()
        self.framed: list[Any] | None = []


class RecordDigest:
    """The digest of a database's records (:data:`DIGEST_METHOD`), given in key order a
    batch at a time; :meth:`fields` is None if they came out of order (then the digest
    would not be the database's).

    A batch's bytes are hashed on a thread of their own while the writer goes on
    (hashlib lets go of the GIL): sha256 takes about a sixth of a conversion's time.
    """

    def __init__(self) -> None:
        import hashlib
        import struct

        self._hash = hashlib.sha256()
        self._pack = struct.Struct(">I").pack
        self._last: bytes | None = None
        self._ordered = True
        self._hashing: Any = None  # the thread hashing the last batch
        self._in_place = False  # it reads the batch's own values (not a copy)
        self.count = 0

    def add(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Add records, each ``(key, value)``, that follow those added before."""
        if not items:
            return
        import itertools
        import threading

        pack = self._pack
        keys = [key for key, _ in items]
        if (self._last is not None and keys[0] <= self._last) or any(
            map(bytes.__ge__, keys, keys[1:])
        ):
            self._ordered = False
        self._last = keys[-1]
        framed_already = getattr(items, "framed", None)
        if framed_already is not None:
            # Framed by the workers (each frame checked by the parent): hashed as it is.
            self._wait()
            self._hashing = threading.Thread(
                target=_update, args=(self._hash, tuple(framed_already)),
                name="mnist2db-digest", daemon=True,
            )  # fmt: skip
            self._hashing.start()
            self.count += len(items)
            return
        values = [value for _, value in items]
        key_sizes, value_sizes = set(map(len, keys)), set(map(len, values))
        if len(key_sizes) == len(value_sizes) == 1:  # Caffe's keys, one record layout
            key_size, value_size = pack(key_sizes.pop()), pack(value_sizes.pop())
            parts: Iterable[tuple[bytes, ...]] = zip(
                itertools.repeat(key_size), keys, itertools.repeat(value_size), values
            )
        else:
            parts = ((pack(len(k)), k, pack(len(v)), v) for k, v in zip(keys, values, strict=True))
        framed: tuple[bytes, ...] = tuple(itertools.chain.from_iterable(parts))
        in_place = sum(map(len, values)) >= _JOIN_BELOW * len(values)
        if not in_place:
            framed = (b"".join(framed),)  # small records: one update, not four each
        # (large ones are hashed where they are: no copy of the batch, no page faults)
        self._wait()
        self._in_place = in_place
        self._hashing = threading.Thread(
            target=_update, args=(self._hash, framed), name="mnist2db-digest", daemon=True
        )
        self._hashing.start()
        self.count += len(items)

    def done_reading(self) -> None:
        """Return once the values of the last batch added are read no more (their hash
        reads large ones in place, on its thread): their buffers may then be reused."""
        if self._in_place:
            self._wait()

    def _wait(self) -> None:
        if self._hashing is not None:
            self._hashing.join()
            self._hashing = None
        self._in_place = False

    @property
    def sha256(self) -> str:
        self._wait()
        return self._hash.hexdigest()

    def fields(self) -> dict[str, Any] | None:
        """What ``mnist2db.json`` records as ``digest``, or None (records out of order)."""
        if not self._ordered:
            return None
        return {"records": self.count, "sha256": self.sha256, "method": DIGEST_METHOD}


#: Records below this mean size are framed into one string before they are hashed.
_JOIN_BELOW = 16 << 10


def _update(hashing: Any, parts: tuple[bytes, ...]) -> None:
    for part in parts:
        hashing.update(part)


def digest_items(
    items: Iterable[tuple[bytes, bytes]],
    progress: Callable[[int], None] | None = None,
    batch: int = 1000,
) -> RecordDigest:
    """The :class:`RecordDigest` of records given in key order, ``batch`` at a time;
    ``progress(count)`` after each batch."""
    digest = RecordDigest()
    pending: list[tuple[bytes, bytes]] = []
    for key, value in items:
        pending.append((bytes(key), bytes(value)))
        if len(pending) == batch:
            digest.add(pending)
            pending = []
            if progress is not None:
                progress(digest.count)
    digest.add(pending)
    if progress is not None:
        progress(digest.count)
    return digest
