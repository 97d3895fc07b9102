"""Many records decoded on a few threads, results in order: zlib and Pillow release the
GIL, so PNG records scale with processors. Used by the reading API's batches
(:mod:`mnist2db.reading.datum_dataset`, :mod:`mnist2db.reading.decoder`); the threads are
:mod:`mnist2db.thread_pool`'s.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from mnist2db.formats.png.encoder import PNG_SIGNATURE
from mnist2db.thread_pool import in_a_pool_thread, run_chunks, shared_pool, thread_count

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def looks_encoded(value: bytes) -> bool:
    """True when a serialized Datum seems to hold a PNG or JPEG near its start: worth
    decoding on threads (a guess that only chooses threads or not)."""
    head = value[:64]
    return PNG_SIGNATURE in head or b"\xff\xd8\xff" in head


def decode_many(
    decode: Callable[[K, V], T],
    keys: Sequence[K],
    values: Sequence[V],
    *,
    threaded: bool | None = None,
) -> list[T]:
    """``[decode(k, v) for k, v in zip(keys, values)]``, in that order, on a few threads
    when there are enough records and more than one processor. ``threaded``: None decides
    by the first value (serialized Datums holding encoded images: threads; anything else
    decodes in this thread, where the GIL would let threads gain nothing). The first
    failure, in order, is raised."""
    n = len(values)
    if threaded is None:
        first = values[0] if n else None
        threaded = isinstance(first, bytes) and looks_encoded(first)
    if not threaded:
        return [decode(k, v) for k, v in zip(keys, values, strict=True)]

    def run(start: int, stop: int) -> list[T]:
        return [decode(keys[i], values[i]) for i in range(start, stop)]

    return run_chunks(run, n)


def inflate_many(streams: Sequence[bytes], size: int) -> list[bytes]:
    """Each zlib stream inflated, in order: its bytes when they are exactly ``size`` long,
    else ``b""`` (also when it does not inflate). On this process's threads when there are
    enough, this thread one of them: a worker runs nothing but zlib per stream, so the
    threads seldom wait for the GIL. At most one stream's output of another length is
    held per thread at a time."""
    n = len(streams)
    if (
        n < 2 * _INFLATE_CHUNK
        or not _long_calls(streams[0], size)
        or thread_count() < 2
        or in_a_pool_thread()
    ):
        return _inflate_part(streams, size)
    # Every thread takes the next few streams until none are left, rather than a share
    # fixed in advance: a thread that waits for the GIL (the one that just released it
    # often takes it again first) does less, and none waits for the slowest.
    out = [b""] * n
    starts = iter(range(0, n, _INFLATE_CHUNK))
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                start = next(starts, None)
            if start is None:
                return
            stop = start + _INFLATE_CHUNK
            out[start:stop] = _inflate_part(streams[start:stop], size)

    pool = shared_pool()
    futures = [pool.submit(run) for _ in range(thread_count() - 1)]
    run()
    for future in futures:
        future.result()
    return out


def _long_calls(stream: bytes, size: int) -> bool:
    """Whether zlib calls like the one that inflates ``stream`` to ``size`` bytes run long
    enough for threads to gain. Each call takes the GIL back when it ends; by measurement
    on two cores, a 28x28 image's stream in one fixed-Huffman block (~2 µs a call: zlib
    decodes those without building tables) inflated no faster on two threads than on one,
    the threads mostly waiting for each other's GIL, while dynamic-Huffman streams (~5
    µs: tables built per stream) went 1.3 to 1.5 times as fast. So: threads for outputs of
    :data:`_LONG_OUTPUT` bytes or more, or a first block of dynamic codes (the zlib header's
    2 bytes, then BFINAL and BTYPE in the low bits of the next)."""
    return size >= _LONG_OUTPUT or (len(stream) > 2 and stream[2] & 0b110 == 0b100)


#: Inflated bytes from which a zlib call is long enough for threads whatever its codes.
_LONG_OUTPUT = 8192
#: Streams a thread takes at a time: small enough that the threads end together, large
#: enough that taking them costs little (a 28x28 image inflates in 2 to 6 µs).
_INFLATE_CHUNK = 16


def _inflate_part(streams: Sequence[bytes], size: int) -> list[bytes]:
    decompress = zlib.decompress
    try:
        return [raw if len(raw) == size else b"" for raw in map(decompress, streams)]
    except zlib.error:
        pass
    out = []  # a stream that does not inflate: the others one by one
    for stream in streams:
        try:
            raw = decompress(stream)
        except zlib.error:
            raw = b""
        out.append(raw if len(raw) == size else b"")
    return out


def decode_stream(
    decode_batch: Callable[[list[bytes], list[bytes]], tuple[list[T], Exception | None]],
    items: Iterable[tuple[bytes | memoryview, bytes | memoryview]],
    limit: int,
    *,
    batch_records: int = 256,
    batch_bytes: int = 256 << 10,
) -> Iterator[tuple[bytes, T]]:
    """``(key, record)`` for the first ``limit`` of ``items``, read a batch ahead (at most
    ``batch_records`` records, ``batch_bytes`` of values) and decoded by
    ``decode_batch(keys, values)``, which returns the records decoded in order up to the
    first that fails, and that failure (or None). Records before a failure are yielded,
    then the failure raised."""
    keys: list[bytes] = []
    values: list[bytes] = []
    size = 0
    for key, value in items:
        if limit <= 0:
            break
        limit -= 1
        keys.append(bytes(key))
        values.append(bytes(value))
        size += len(values[-1])
        if len(keys) >= batch_records or size >= batch_bytes or limit == 0:
            records, failure = decode_batch(keys, values)
            yield from zip(keys, records, strict=False)
            if failure is not None:
                raise failure
            keys, values, size = [], [], 0
    if keys:
        records, failure = decode_batch(keys, values)
        yield from zip(keys, records, strict=False)
        if failure is not None:
            raise failure
