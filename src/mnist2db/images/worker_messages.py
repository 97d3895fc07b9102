"""What crosses from a decoding worker to the parent (:mod:`mnist2db.images.workers`): a
message of results (:class:`ResultMessage`), framed as ``Connection.send_bytes`` frames
it, each record in the worker's ring (:mod:`mnist2db.images.result_ring`) or, where it
does not fit, in the message after a pickle of the rest; small records under their keys
as a run (:class:`Run`: consecutive records of one layout, framed as the records' digest
frames them, checked by the parent in a few calls of C); read back many messages to a
read (:func:`receive_messages`), each record a view, without a copy
(:func:`unpack_results`); and the parent's wait on many pipes (:class:`PipeWaiter`).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from multiprocessing.connection import wait
from operator import itemgetter

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.images.result_ring import ResultRing, RingError

if TYPE_CHECKING:
    from typing import Any

#: Records below this size travel in the message instead (the pipe's copy of a few KiB
#: costs less than a span's bookkeeping on both sides).
RING_MIN = 16 << 10

_HEAD = struct.Struct("<I")  # a message's pickle's size
_LENGTH, _LONG_LENGTH = struct.Struct("!i"), struct.Struct("!Q")  # Connection's framing
#: Bytes the parent reads at once: a message of records in a ring is ~70 bytes a record, one
#: of small records in the message itself about 256 KiB at most (the workers' MESSAGE_BYTES).
_READ_AHEAD = 320 << 10
_IOV_MAX = 1024


_BLOB = (bytes, bytearray, memoryview)
_FRAME = struct.Struct(">I")  # a key's or a value's length in a run (the digest's framing)
_LENGTHS, _PAIR = itemgetter(0, 2), itemgetter(1, 3)
_runs: dict[tuple[int, int], struct.Struct] = {}  # (key, value) lengths: a record's layout


def result_size(result: Any) -> int:
    """The bytes ``result`` holds (a record's, an array's, a reason's)."""
    if isinstance(result, tuple) and result and isinstance(result[0], _BLOB):
        return len(result[0])
    return int(getattr(result, "nbytes", 0)) or len(str(result))


class ResultMessage:
    """A worker's results gathered for one message (:meth:`parts`, written as one by
    :func:`send_message`). A result ``(bytes, ...)`` (a record) travels in the worker's ring, the
    message holding its span; if it does not fit there, as its bytes alone after a pickle
    of everything else: no pickling of the records, no copy of them into the message, and
    the parent takes them as views of the ring or of the message, without a copy.
    ``size``: the bytes of results gathered (records counted wherever they travel)."""

    def __init__(self, ring: ResultRing | None) -> None:
        self._ring = ring
        # -1: pickled; a length; a ring span; a run: [records, key length, value length]
        self.sizes: list[int | tuple[int, int] | list[int]] = []
        self.rest: list[Any] = []
        self.blobs: list[bytes | bytearray] = []
        self.size = 0
        self._run: list[int] | None = None  # the run being added to (the last of sizes)
        self._run_shape: Any = None

    def add(self, result: Any, key: bytes | None = None) -> None:
        """Add ``result``; ``key``: the record's key, when the parent takes small records
        as runs (:class:`Run`)."""
        if type(result) is tuple and result and isinstance(result[0], (bytes, bytearray)):
            record = result[0]
            ring = self._ring
            if key is not None and len(result) == 2 and (ring is None or len(record) < RING_MIN):
                self._add_to_run(key, record, result[1])
                return
            self._run = None
            span = None if ring is None or len(record) < RING_MIN else ring.put(record)
            if span is None:
                self.sizes.append(len(record))
                self.blobs.append(record)
            else:
                self.sizes.append(span)
            self.rest.append(result[1:])
            self.size += len(record)
        else:
            self._run = None
            self.sizes.append(-1)
            self.rest.append(result)
            self.size += result_size(result)

    def _add_to_run(self, key: bytes, record: bytes | bytearray, shape: Any) -> None:
        """``record`` under ``key`` framed as the digest frames it, in the run of the records
        before it if they are of its layout (key and value lengths, shape), else a new one."""
        run = self._run
        if run is None or run[1] != len(key) or run[2] != len(record) or shape != self._run_shape:
            run = self._run = [0, len(key), len(record)]
            self._run_shape = shape
            self.sizes.append(run)
            self.rest.append((shape,))
        run[0] += 1
        self.blobs.append(_FRAME.pack(len(key)) + key + _FRAME.pack(len(record)))
        self.blobs.append(record)
        self.size += len(record)

    def parts(self) -> list[bytes | bytearray]:
        """The message, in parts (written as one by :func:`send_message`)."""
        blobs = self.blobs
        if len(blobs) > 2 and self.size < RING_MIN * len(blobs):
            blobs = [b"".join(blobs)]  # small records: one copy, not a part (a view) each
        return _pack(self.sizes, self.rest, blobs)


def _pack(
    sizes: list[int | tuple[int, int] | list[int]],
    rest: list[Any],
    blobs: list[bytes | bytearray],
) -> list[bytes | bytearray]:
    """One message's parts: its framing and a pickle of ``(sizes, rest)``, then ``blobs``."""
    head = pickle.dumps((sizes, rest), protocol=pickle.HIGHEST_PROTOCOL)
    size = _HEAD.size + len(head) + sum(map(len, blobs))
    framing = _LENGTH.pack(size) if size < 1 << 31 else _LENGTH.pack(-1) + _LONG_LENGTH.pack(size)
    return [framing + _HEAD.pack(len(head)) + head, *blobs]


def send_message(fd: int, parts: list[bytes | bytearray]) -> None:
    """``parts`` written to ``fd`` as one message, framed as ``send_bytes`` frames it."""
    views = [memoryview(part) for part in parts]
    while views:
        wrote = os.writev(fd, views[:_IOV_MAX])
        while views and wrote >= len(views[0]):
            wrote -= len(views[0])
            views.pop(0)
        if views and wrote:
            views[0] = views[0][wrote:]


def receive_messages(fd: int) -> list[bytes | bytearray | memoryview]:
    """The messages :func:`send_message` wrote to ``fd`` that are there now, at least one (waited
    for), each read whole: one read takes what the pipe holds (many messages of records in
    rings), and a message it took only the start of is read to its end.

    Raises:
        EOFError: the other end closed (or died) before a message was whole.
        ValueError: a length that is not one.
    """
    data: bytes | bytearray = os.read(fd, _READ_AHEAD)
    if not data:
        raise EOFError
    messages: list[bytes | bytearray | memoryview] = []
    at = 0
    while at < len(data):
        if len(data) - at < _LENGTH.size:
            data, at = _read_more(fd, data, at, _LENGTH.size), 0
        size = _LENGTH.unpack_from(data, at)[0]
        begin = at + _LENGTH.size
        if size == -1:  # over 2 GiB: an 8-byte length follows
            if len(data) - begin < _LONG_LENGTH.size:
                data, at = _read_more(fd, data, at, _LENGTH.size + _LONG_LENGTH.size), 0
                begin = _LENGTH.size
            size = _LONG_LENGTH.unpack_from(data, begin)[0]
            begin += _LONG_LENGTH.size
        elif size < 0:
            raise ValueError(f"a message of {size} bytes")
        if begin + size > len(data):  # the rest of it still in the pipe
            whole = bytearray(size)
            whole[: len(data) - begin] = memoryview(data)[begin:]
            messages.append(read_into(fd, whole, len(data) - begin))
            return messages
        messages.append(memoryview(data)[begin : begin + size])
        at = begin + size
    return messages


def _read_more(fd: int, data: bytes | bytearray, at: int, need: int) -> bytearray:
    """``data[at:]`` and what follows it in ``fd``, at least ``need`` bytes in all."""
    have = len(data) - at
    more = bytearray(have + need)
    more[:have] = memoryview(data)[at:]
    return read_into(fd, more, have)


def read_into(fd: int, buffer: bytearray, at: int = 0) -> bytearray:
    """``buffer`` from ``at`` on filled from ``fd``.

    Raises:
        EOFError: the other end closed first.
    """
    view = memoryview(buffer)
    while at < len(buffer):
        got = os.readv(fd, [view[at:]])
        if not got:
            raise EOFError
        at += got
    return buffer


def unpack_results(
    message: bytes | bytearray | memoryview, ring: ResultRing | None
) -> tuple[list[tuple[Any, int, int]], int]:
    """:class:`ResultMessage`'s results, each ``(result, bytes held, ring end)``: a record's
    bytes a ``memoryview`` of ``ring`` (the end of its span, else -1) or of ``message`` (the
    bytes it holds in the parent), a :class:`Run` of records (not yet checked against its
    entries: :meth:`Run.check`); and the bytes of all its results.

    Raises:
        RingError: a span outside the space the ring gave the worker, or a ring where none
            was given: nothing of the message is then taken.
        ValueError: the message is not one :class:`ResultMessage` made; a garbled one may
            raise anything unpickling meets (the caller takes any exception as a result
            that is not one).
    """
    view = memoryview(message)
    at = _HEAD.size + _HEAD.unpack_from(view)[0]
    sizes, rest = pickle.loads(view[_HEAD.size : at])
    results: list[tuple[Any, int, int]] = []
    made = 0
    for size, other in zip(sizes, rest, strict=True):
        if type(size) is list:
            run = Run.framed_at(view, at, size, other)
            results.append((run, len(run.framed), -1))
            at += len(run.framed)
            made += run.value_bytes
        elif type(size) is tuple:
            if ring is None or len(size) != 2:
                raise RingError(f"a worker announced a record at {size!r} without a ring")
            start, length = size
            results.append(((ring.view(start, length), *other), 0, start + length))
            made += length
        elif size < 0:
            results.append((other, result_size(other), -1))
            made += results[-1][1]
        else:
            if at + size > len(view):
                raise ValueError("a message shorter than its records")
            results.append(((view[at : at + size], *other), size, -1))
            at += size
            made += size
    return results, made


class Run:
    """Consecutive records of one layout (key and value lengths, shape), as a worker sends
    them: ``framed``, each record as the records' digest frames it (4-byte big-endian key
    length, key, 4-byte big-endian value length, value:
    :data:`~mnist2db.storage.record_digest.DIGEST_METHOD`), so that the parent hashes a run
    in one call and takes its ``(key, value)`` pairs in a few calls of C. ``entries`` and
    ``pairs`` are set by :meth:`check`, once the keys are known to be the entries' own."""

    __slots__ = ("count", "key_size", "value_size", "shape", "framed", "entries", "pairs")

    def __init__(self, count: int, key_size: int, value_size: int, shape: Any,
                 framed: memoryview) -> None:  # fmt: skip
        self.count, self.key_size, self.value_size = count, key_size, value_size
        self.shape, self.framed = shape, framed
        self.entries: list[Any] = []
        self.pairs: list[tuple[bytes, bytes]] = []

    @property
    def value_bytes(self) -> int:
        return self.count * self.value_size

    @classmethod
    def framed_at(cls, view: memoryview, at: int, layout: object, rest: object) -> Run:
        """The run a message announces with ``layout`` (``[records, key length, value
        length]``) and ``rest`` (``(shape,)``), its records at ``view[at:]``.

        Raises:
            ValueError: a layout that is not one, or a message shorter than its records.
        """
        if (
            not isinstance(layout, list)
            or len(layout) != 3
            or any(type(n) is not int for n in layout)
            or not isinstance(rest, tuple)
            or len(rest) != 1
        ):
            raise ValueError(f"a run of records announced as {layout!r}")
        count, key_size, value_size = layout
        if count < 1 or key_size < 0 or value_size < 0:
            raise ValueError(f"a run of records announced as {layout!r}")
        length = count * (8 + key_size + value_size)
        if at + length > len(view):
            raise ValueError("a message shorter than its records")
        return cls(count, key_size, value_size, rest[0], view[at : at + length])

    def check(self, entries: list[Any], keys: list[bytes]) -> None:
        """Take the run as the records of ``entries``, whose keys are ``keys``: every frame
        must hold the announced lengths and the entry's own key (else nothing is taken).

        Raises:
            ValueError: a run of another length than ``entries``, or a frame that is not
                the announced layout's or holds another key.
        """
        if len(entries) != self.count or len(keys) != self.count:
            raise ValueError("a run of another length than its entries")
        layout = (self.key_size, self.value_size)
        unpack = _runs.get(layout)
        if unpack is None:
            if len(_runs) >= 64:
                _runs.clear()
            unpack = _runs[layout] = struct.Struct(f">I{layout[0]}sI{layout[1]}s")
        frames = list(unpack.iter_unpack(self.framed))
        if set(map(_LENGTHS, frames)) != {layout} or list(map(itemgetter(1), frames)) != keys:
            raise ValueError("a run of records that are not its entries'")
        self.entries = entries
        self.pairs = list(map(_PAIR, frames))


class PipeWaiter:
    """Waits for workers' results or deaths: one ``poll`` object kept from wait to wait
    (``multiprocessing.connection.wait`` builds a selector for every call: 10-20 µs),
    ``wait`` where there is no ``poll``."""

    def __init__(self) -> None:
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._fds: dict[int, Any] = {}  # fd polled: its connection or sentinel

    def wait(self, fds: dict[int, Any], timeout: float | None) -> set[Any]:
        """Which of ``fds``' objects (a connection or a process's sentinel, by descriptor)
        are ready to read, waiting at most ``timeout`` seconds (None: until one is)."""
        if not fds:
            return set()
        if self._poll is None:  # pragma: no cover (no poll: Windows)
            return set(wait(list(fds.values()), timeout))
        if fds.keys() != self._fds.keys():
            for fd in self._fds.keys() - fds.keys():
                self._poll.unregister(fd)
            for fd in fds.keys() - self._fds.keys():
                self._poll.register(fd, select.POLLIN)
        self._fds = fds
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        while True:
            try:
                events = self._poll.poll(ms)
                break
            except InterruptedError:  # pragma: no cover (PEP 475 retries it)
                continue
        return {fds[fd] for fd, _ in events if fd in fds}
