"""What mnist2db's processes set for themselves while their workers run: the allocator's
thresholds (:func:`keep_the_heap`), OpenBLAS's thread pool (:func:`one_blas_thread`) and
the size of the pipes to and from a forked process (:func:`widen_pipes`: the imageset's
workers, the export's PNG and file-writing processes)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
from collections.abc import Iterator

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt
_GLIBC_THRESHOLD = 128 << 10  # both thresholds as glibc starts
#: ``(mmap threshold, trim threshold)``: a worker's (a photo's pixels, its record, a
#: message) and the parent's (the messages received, LMDB's pages of a batch's records).
WORKER_HEAP = (16 << 20, 16 << 20)
PARENT_HEAP = (16 << 20, 32 << 20)
#: The size asked for each pipe (Linux's default is 64 KiB: a batch would take a write and a
#: wake-up of the other side every 16 pages; 1 MiB is the default limit for a process).
PIPE_SIZE = 1 << 20


def widen_pipes(*fds: int) -> None:
    """Ask for :data:`PIPE_SIZE` bytes of pipe behind each of ``fds`` (where the system
    allows: an unprivileged process is held to ``/proc/sys/fs/pipe-max-size``, and a refusal
    leaves the pipe as it was)."""
    for fd in fds:
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


def keep_the_heap(thresholds: tuple[int, int] | None) -> None:
    """Let glibc's allocator serve allocations below the first threshold from its heap and
    keep up to the second of freed memory, instead of mapping each allocation over 128 KiB
    on its own and giving it back when freed (each one then faulted in page by page, and
    on this project's test machine, a VM, fresh pages cost most: docs/performance.md).
    None: glibc's own thresholds again, and the free memory given back (glibc only;
    elsewhere nothing)."""
    mmap, trim = thresholds or (_GLIBC_THRESHOLD, _GLIBC_THRESHOLD)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, mmap)
        libc.mallopt(_M_TRIM_THRESHOLD, trim)
        if thresholds is None:
            libc.malloc_trim(0)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's and OpenCV's OpenBLAS, loaded in this block, start no thread pool (each
    starts a thread per core that spins as it starts: 0.05-0.1 s of CPU in the parent here;
    no decoder uses BLAS). The environment is as it was after: OpenBLAS reads it once, as
    it loads, and a library loaded before is not changed."""
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = before or "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
