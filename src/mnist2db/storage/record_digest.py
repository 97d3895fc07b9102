"""The digest of a database's records: what ``verify DB`` compares to find a changed byte.

The one batch writer (:func:`mnist2db.conversion.write_database`) computes it as it
writes, on one thread that lives for the run beside the writer; ``verify`` computes it
again from the records read back. :mod:`mnist2db.recipe` records it in
``mnist2db.json`` (``digest``). LMDB keeps no checksum of its own. A resumable run's
digest saves its state at each commit (:mod:`mnist2db.storage.digest_state`).
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

    def __init__(self, items: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(items)
        self.framed: list[Any] | None = []


class RecordDigest:
    """The digest of a database's records (:data:`DIGEST_METHOD`), given in key order a
    batch at a time; :meth:`fields` is None if they came out of order (then the digest
    would not be the database's).

    A batch's bytes are hashed on one thread that lives for the run, fed a batch at a time
    (hashlib and ctypes let go of the GIL), while the writer writes them; at most one batch
    is being hashed when the next is given. ``hasher``: a sha256 object to continue
    (:mod:`mnist2db.storage.digest_state`'s, whose state can be saved), with the
    ``count`` records and the ``last`` key it has hashed.
    """

    def __init__(self, hasher: Any = None, count: int = 0, last: bytes | None = None) -> None:
        import struct

        if hasher is None:
            import hashlib

            hasher = hashlib.sha256()
        self.hasher = hasher
        self._pack = struct.Struct(">I").pack
        self.last: bytes | None = last
        self._ordered = True
        self._queue: Any = None  # batches for the hashing thread (started with the first)
        self._failed: BaseException | None = None
        self._in_place = False  # the last batch is hashed in place (not a copy)
        self.count = count

    def add(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Add records, each ``(key, value)``, that follow those added before."""
        if not items:
            return
        import itertools

        pack = self._pack
        keys = [key for key, _ in items]
        if (self.last is not None and keys[0] <= self.last) or any(
            map(bytes.__ge__, keys, keys[1:])
        ):
            self._ordered = False
        self.last = keys[-1]
        framed_already = getattr(items, "framed", None)
        if framed_already is not None:
            # Framed by the encoder or the workers (each frame checked): hashed as it is.
            self._submit(tuple(framed_already), in_place=False)
            self.count += len(items)
            return
        values = [value for _, value in items]
        key_sizes, value_sizes = set(map(len, keys)), set(map(len, values))
        in_place = sum(map(len, values)) >= _JOIN_BELOW * len(values)
        framed: tuple[Any, ...]
        if in_place:
            # Large records are hashed where they are (no copy of the batch, no page
            # faults): their heads joined, two updates a record.
            heads = (pack(len(k)) + k + pack(len(v)) for k, v in zip(keys, values, strict=True))
            framed = tuple(itertools.chain.from_iterable(zip(heads, values, strict=True)))
        else:
            parts: Iterable[tuple[bytes, ...]]
            if len(key_sizes) == len(value_sizes) == 1:  # Caffe's keys, one record layout
                key_size, value_size = pack(key_sizes.pop()), pack(value_sizes.pop())
                parts = zip(itertools.repeat(key_size), keys, itertools.repeat(value_size), values)
            else:
                parts = ((pack(len(k)), k, pack(len(v)), v) for k, v in zip(keys, values, strict=True))  # fmt: skip
            framed = (b"".join(itertools.chain.from_iterable(parts)),)  # one update, not four each
        self._submit(framed, in_place)
        self.count += len(items)

    def _submit(self, parts: tuple[Any, ...], in_place: bool) -> None:
        self.wait()  # one batch hashed at a time: memory bounded by it
        if self._queue is None:
            import queue
            import threading

            self._queue = queue.Queue()
            threading.Thread(
                target=self._hash_batches, args=(self._queue,), name="mnist2db-digest",
                daemon=True,
            ).start()  # fmt: skip
        self._in_place = in_place
        self._queue.put(parts)

    def _hash_batches(self, batches: Any) -> None:
        update = self.hasher.update
        while True:
            parts = batches.get()
            try:
                if parts is None:
                    return
                if self._failed is None:
                    for part in parts:
                        update(part)
            except BaseException as exc:  # raised by wait(), on the writer's thread
                self._failed = exc
            finally:
                batches.task_done()

    def done_reading(self) -> None:
        """Return once the values of the last batch added are read no more (their hash
        reads large ones in place, on its thread): their buffers may then be reused."""
        if self._in_place:
            self.wait()

    def wait(self) -> None:
        """Return once every batch added is hashed."""
        if self._queue is not None:
            self._queue.join()
        self._in_place = False
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        """End the hashing thread (the digest is then final)."""
        if self._queue is not None:
            self._queue.put(None)
            self._queue.join()
            self._queue = None

    @property
    def ordered(self) -> bool:
        return self._ordered

    def mark_unordered(self) -> None:
        """The records hashed before were out of order (a resumed run's saved state)."""
        self._ordered = False

    @property
    def sha256(self) -> str:
        self.wait()
        return str(self.hasher.hexdigest())

    def fields(self) -> dict[str, Any] | None:
        """What ``mnist2db.json`` records as ``digest``, or None (records out of order)."""
        if not self._ordered:
            return None
        return {"records": self.count, "sha256": self.sha256, "method": DIGEST_METHOD}


#: Records below this mean size are framed into one string before they are hashed.
_JOIN_BELOW = 16 << 10


def digest_items(
    items: Iterable[tuple[bytes, bytes]],
    progress: Callable[[int], None] | None = None,
    batch: int = 1000,
) -> RecordDigest:
    """The :class:`RecordDigest` of records given in key order, ``batch`` at a time;
    ``progress(count)`` after each batch."""
    digest = RecordDigest()
    pending: list[tuple[bytes, bytes]] = []
    try:
        for key, value in items:
            pending.append((bytes(key), bytes(value)))
            if len(pending) == batch:
                digest.add(pending)
                pending = []
                if progress is not None:
                    progress(digest.count)
        digest.add(pending)
        digest.wait()
    finally:
        digest.close()
    if progress is not None:
        progress(digest.count)
    return digest
