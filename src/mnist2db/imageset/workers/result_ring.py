"""A worker's records in memory it shares with the parent: one ring of bytes per worker, so
that a record crosses from the worker to the database without a pipe.

The parent maps the ring (anonymous, ``MAP_SHARED``) before it forks the worker. The worker
copies each record it makes into the ring (:meth:`ResultRing.put`) and sends the parent only
where it is, a ``(start, length)`` span; the parent takes the record as a view of the ring
(:meth:`ResultRing.view`), hands it to the database writer and to the digest as it is, and
gives its space back (:meth:`ResultRing.release`) once the batch holding it is written.

Positions are byte counts since the ring began (a record at ``start`` lies at ``start %
size``; a record is never split over the ring's end: the worker skips the tail instead).
The worker writes the ring's data; the parent writes only the count of bytes it has
released, in the ring's header, and reads from the ring only what it has checked: a span
must begin at or after the end of the last record it accepted, lie within the ring, and end
within the space released to the worker, so a worker that sends garbage, or dies in the
middle of a record it has not announced, can cost its own images only. A record that does
not fit (the record larger than a quarter of the ring, or the ring still full after
``patience`` seconds: the parent commits a batch in ~10 ms) goes through the pipe as before,
so that nothing waits on the ring for long, whatever the parent does.
"""

from __future__ import annotations

import mmap
import struct
import time

from mnist2db.errors import Mnist2dbError

#: The released count: the parent's, read by the worker; the data begins a cache line on.
_RELEASED = struct.Struct("=Q")
_HEADER = 64
_NAP = 0.0005  # seconds between two looks at the released count, while the ring is full


class RingError(Mnist2dbError):
    """A worker announced a record outside the space its ring gave it."""


class ResultRing:
    """``size`` bytes shared between the parent and the one worker forked after it;
    ``patience``: seconds a worker waits for space before a record goes by the pipe (0 where
    the parent never releases any)."""

    def __init__(self, size: int, patience: float = 0.0) -> None:
        self.size = size
        self.patience = patience
        # Anonymous and shared: the worker forked next sees the same pages.
        self._map = mmap.mmap(-1, _HEADER + size)
        self._data = memoryview(self._map)[_HEADER:]
        self._written = 0  # the worker's: the end of the last record it put
        self._accepted = 0  # the parent's: the end of the last record it took
        self._released = 0  # the parent's: the bytes given back to the worker

    # The worker's side.

    def put(self, record: bytes | bytearray) -> tuple[int, int] | None:
        """Copy ``record`` into the ring; its ``(start, length)``, or None if it does not fit
        (it then goes by the pipe)."""
        size = self.size
        length = len(record)
        if length > size >> 2:
            return None
        written = start = self._written
        at = start % size
        if at + length > size:  # not split over the end: the tail is skipped
            start += size - at
            at = 0
        deadline = 0.0
        while True:
            released = _RELEASED.unpack_from(self._map)[0]
            if not written - size <= released <= written:
                return None  # a count the parent did not write: take it for no space at all
            if start + length - released <= size:
                break
            now = time.monotonic()
            if not deadline:
                deadline = now + self.patience
            if now >= deadline:
                return None
            time.sleep(_NAP)
        self._data[at : at + length] = record
        self._written = start + length
        return start, length

    # The parent's side.

    def view(self, start: object, length: object) -> memoryview:
        """The record a worker announced at ``(start, length)``, as a view of the ring.

        Raises:
            RingError: the span is not one the worker could have written since the last
                record taken (out of the ring, over a record not yet released, or before
                one already taken).
        """
        size = self.size
        if (
            type(start) is not int
            or type(length) is not int
            or length < 0
            or start < self._accepted
            or start % size + length > size
            or start + length > self._released + size
        ):
            raise RingError(f"a worker announced a record at {start!r}+{length!r} outside its ring")
        self._accepted = start + length
        at = start % size
        return self._data[at : at + length]

    def release(self, end: int) -> None:
        """Give the worker back the ring up to ``end`` (the end of a record taken): every
        record before it is written and no longer read."""
        if self._released < end <= self._accepted:
            self._released = end
            _RELEASED.pack_into(self._map, 0, end)
