"""The process's few threads for work that releases the GIL (zlib, Pillow), and work
split into chunks on them, results in order: the PNG encoder's (:mod:`mnist2db.formats.png.encoder`)
and the record decoders' (:mod:`mnist2db.reading.threaded`). A forked child makes its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: Records per task: large enough that the pool's overhead (~20 µs a task) is small.
_CHUNK = 64
_pool: ThreadPoolExecutor | None = None
#: The pool's threads' names begin so (a task that would wait for the pool runs in place).
_NAME = "mnist2db-png"
_pool_pid = 0
_pool_lock = threading.Lock()


def thread_count() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def shared_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        # A forked child inherits the pool object but not its threads: it makes its own.
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(thread_count(), thread_name_prefix=_NAME)
            _pool_pid = os.getpid()
        return _pool


def run_chunks(work: Callable[[int, int], list[T]], n: int) -> list[T]:
    """``work(start, stop)`` over ``range(n)`` in chunks of :data:`_CHUNK` or more, on this
    process's threads when there are at least two chunks' worth and two processors, the
    lists joined in order (the first failure, in order, is raised)."""
    threads = thread_count()
    if n < 2 * _CHUNK or threads < 2:
        return work(0, n)
    # A few chunks a thread: even when one thread is slowed, the others take the rest.
    size = max(_CHUNK, -(-n // (4 * threads)))
    out: list[T] = []
    for part in shared_pool().map(
        lambda start: work(start, min(n, start + size)), range(0, n, size)
    ):
        out += part
    return out


def in_a_pool_thread() -> bool:
    """True in one of the pool's threads (where a task that waited for the pool would
    wait for itself: it runs in place)."""
    return threading.current_thread().name.startswith(_NAME)
