"""Images decoded on worker processes, the results in list order, in bounded memory.

Each of ``jobs`` worker processes takes tasks of :data:`CHUNK` consecutive entries (at most
:data:`AHEAD` tasks queued each; fewer of each once results show large records:
:data:`TASK_BYTES`, :data:`AHEAD_BYTES`) and sends back what ``work`` made of each (a
record, pixels, or the reason it could not be read), a message per
:data:`~mnist2db.images.worker_loop.MESSAGE_BYTES` of results (the worker's side:
:mod:`mnist2db.images.worker_loop`). A record travels in the worker's ring of shared memory
(:mod:`mnist2db.images.result_ring`, :data:`RING_BYTES`), the message saying only where it
is; one that does not fit there, in the message. Where the caller gives each entry's key
(``keys``), small records come as runs (:class:`~mnist2db.images.worker_messages.Run`:
consecutive records of one layout under their keys, checked by the parent against the
entries' own keys, :meth:`OrderedDecoding.runs`). The parent reorders them and yields them
in list order; it writes the database itself, so no database is ever used by two processes
(the workers are started before it is opened, and never touch it). A record yielded is a
view of the ring, valid until :meth:`OrderedDecoding.release` gives its space back.

Bounds: results waiting for an earlier one hold at most :data:`WINDOW_BYTES`; beyond that
the parent reads only from the worker holding the next entry, and the others wait (each
holds one image). A worker that dies (a decoder's crash, the OOM killer) or spends more than
``timeout`` seconds on one image (a hostile file that hangs a decoder) costs that image
alone: it is reported as unreadable with the cause, the worker replaced, its other entries
given to the new one. An exception or a signal in the parent (SIGINT/SIGTERM raise in its
main thread, even while it waits) kills every worker at once: nothing waits for them.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from multiprocessing.connection import Connection

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.image_list import ListEntry
from mnist2db.formats.opencv import opencv
from mnist2db.images.process_setup import PARENT_HEAP, keep_the_heap, one_blas_thread, widen_pipes
from mnist2db.images.result_ring import ResultRing
from mnist2db.images.worker_loop import attempt, serve, shown_entry
from mnist2db.images.worker_messages import PipeWaiter, Run, receive_messages, unpack_results

if TYPE_CHECKING:
    from typing import Any

#: Entries per task handed to a worker, and tasks queued per worker: enough that a worker
#: descheduled for a while (a busy machine) does not leave the others and the writer waiting
#: on it (tiny images decode in ~25 µs each); the results stay bounded by WINDOW_BYTES.
CHUNK = 32
AHEAD = 8
#: Bytes of results a task makes at most, and a worker's queued tasks, once the records'
#: size is known (photos: tasks of 10, two queued): so that at the list's end a worker
#: that was slow (descheduled) leaves the others waiting for little.
TASK_BYTES = 2 << 20
AHEAD_BYTES = 8 << 20
#: Bytes of results held by the parent while an earlier entry is still being decoded (the
#: records in the rings aside: the rings bound those).
WINDOW_BYTES = 16 << 20
#: Bytes of each worker's ring of records: a batch being written (4 MiB at most, its share
#: of it with several workers) and what the worker makes meanwhile, so that it does not
#: wait while the parent commits. Its pages count in the resident set of the worker and of
#: the parent (shared: once in PSS).
RING_BYTES = 8 << 20
#: Seconds a worker waits for space in its ring (the parent writing a batch) before a record
#: goes by the pipe, where the caller releases what it has written (:meth:`release`).
RING_PATIENCE = 0.05
#: Seconds one image may take before its worker is taken for hung and killed.
DEFAULT_TIMEOUT = 60.0


#: The most workers started when ``--jobs`` is not given: more cores than this get this
#: many. Eight keep the run's processes within 256 MiB together (PSS 174 MiB for photos
#: resized: they share the decoders, and each has its 8 MiB ring) and are 2-3 times what
#: the one writer takes of photo-sized images (docs/performance.md); ``-j N`` asks for more.
DEFAULT_JOBS_LIMIT = 8


def default_jobs() -> int:
    """The processors this process may run on (its affinity), at least 1 and at most
    :data:`DEFAULT_JOBS_LIMIT`."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, min(DEFAULT_JOBS_LIMIT, cores))


class _Worker:
    """One worker process, its connection and its tasks: ``(first seq, entries)`` in order;
    ``received``: results of the first task already received; ``since``: when it last
    delivered (or was given work while idle)."""

    def __init__(
        self,
        context: Any,
        work: Callable[[ListEntry], Any],
        root: bytes,
        patience: float,
        keys: Callable[[ListEntry], bytes] | None = None,
        warm: Callable[[], None] | None = None,
    ) -> None:
        # Two pipes, tasks down and results up; the results' holds a megabyte (Linux's
        # limit for anyone), so a record that does not fit the ring crosses in one or two
        # writes, not twenty. A ring of its own, mapped before the fork (not with spawn:
        # a map is not passed to a process started afresh).
        task_out, task_in = multiprocessing.Pipe(duplex=False)
        self.conn, result_in = multiprocessing.Pipe(duplex=False)
        widen_pipes(result_in.fileno())
        forked = context.get_start_method() == "fork"
        self.ring = ResultRing(RING_BYTES, patience) if forked and RING_BYTES else None
        args = (task_out, result_in, work, root, self.ring, keys, warm)
        self.process = context.Process(target=serve, args=args, daemon=True)
        with warnings.catch_warnings():
            # Python 3.12+ warns of fork() beside threads: the workers are safe (_context).
            warnings.simplefilter("ignore", DeprecationWarning)
            self.process.start()
        task_out.close()
        result_in.close()
        self.tasks_conn: Connection = task_in
        self.tasks: deque[tuple[int, list[ListEntry]]] = deque()
        self.spans: deque[tuple[int, int]] = deque()  # (seq, end) of each record in the ring
        self.received = 0
        self.since = time.monotonic()
        self.stopped = False  # told to end, or killed

    def next_seq(self) -> int | None:
        return self.tasks[0][0] + self.received if self.tasks else None

    def kill(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.process.kill()

    def reap(self) -> None:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            self.process.join(5)
        for conn in (self.conn, self.tasks_conn):
            with contextlib.suppress(OSError):
                conn.close()


def _context() -> Any:
    """fork where there is one (cheap: nothing to import again, nothing to pickle; the
    workers touch no lock another thread may hold: they decode and write a pipe), else spawn."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")  # pragma: no cover


def _preload() -> None:
    """Import the decoders once, before the workers fork, rather than once in each."""
    import numpy  # noqa: F401
    from PIL import Image

    Image.preinit()
    opencv()


def _died(worker: _Worker, timeout: float | None) -> str:
    if timeout is not None:
        return f"its decoder took more than {timeout:g} s (killed)"
    code = worker.process.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"its decoder died ({name})"
    return f"its decoder exited ({code})"


class OrderedDecoding:
    """``jobs`` worker processes, started at once (before the caller opens its database),
    decoding ``entries`` with ``work``; iterate for each entry with its result or the reason
    (a str) it could not be read, in order. ``preload`` runs before they fork (what they all
    import, loaded once: by default numpy, Pillow and OpenCV; None: nothing). ``releases``:
    the caller calls :meth:`release` as it is done with records (a worker whose ring is full
    then waits a little for space, rather than send by the pipe). ``keys``: each entry's
    record's key: small records then come as :class:`Run` s from :meth:`runs` (checked
    against these keys). ``warm``: what each worker runs as it starts, before its first
    task (its decoders loaded in parallel with the others' and with the caller's
    preparations; a worker started to replace one that died does without). :meth:`close`
    (or leaving the ``with``) kills the workers at once,
    whatever they are doing."""

    def __init__(
        self,
        entries: Iterable[ListEntry],
        work: Callable[[ListEntry], Any],
        root: bytes,
        jobs: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        preload: Callable[[], None] | None = _preload,
        releases: bool = False,
        keys: Callable[[ListEntry], bytes] | None = None,
        warm: Callable[[], None] | None = None,
    ) -> None:
        self._entries, self._work, self._root = entries, work, root
        self._keys = keys
        self._patience = RING_PATIENCE if releases else 0.0
        self._heap_kept = False
        self._frozen = False
        self._timeout, self._jobs = timeout, jobs
        self._workers: list[_Worker] = []
        self._yielded = [0]  # entries yielded so far
        if jobs <= 0:
            return
        for stream in (sys.stdout, sys.stderr):  # a forked child must not write them again
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        self._context = _context()
        if self._context.get_start_method() == "fork" and preload is not None:
            with one_blas_thread():
                preload()
        # What is loaded by now lives as long as the run: the collector skips it (a full
        # collection walked numpy's and OpenCV's objects again and again), and the workers
        # leave its pages shared (a collection writes to every object it walks).
        gc.freeze()
        self._frozen = True
        try:
            for _ in range(jobs):
                worker = _Worker(self._context, work, root, self._patience, keys, warm)
                self._workers.append(worker)
        except BaseException:
            self.close()
            raise
        # The parent's messages and writer reuse freed memory too (until close).
        keep_the_heap(PARENT_HEAP)
        self._heap_kept = True

    def __iter__(self) -> Iterator[tuple[ListEntry, Any]]:
        for item in self.runs():
            if type(item) is Run:
                for entry, (_, value) in zip(item.entries, item.pairs, strict=True):
                    yield entry, (value, item.shape)
            else:
                yield item  # type: ignore[misc]

    def runs(self) -> Iterator[tuple[ListEntry, Any] | Run]:
        """Each entry with its result, in order, as :meth:`__iter__`; but where ``keys``
        was given, consecutive records of one layout as a :class:`Run` (checked: its keys
        are its entries')."""
        if self._jobs <= 0:
            for entry in self._entries:
                yield entry, attempt(self._work, self._root, entry)
            return
        try:
            yield from _run(iter(self._entries), self._workers, self._context, self._work,
                            self._root, self._timeout, self._yielded,
                            self._patience, self._keys)  # fmt: skip
        finally:
            # The workers end while the caller writes its last batch; close() reaps them.
            self._stop()

    def release(self) -> None:
        """The records yielded so far are no longer read (written, and hashed): their space
        in the rings may be reused. Until this is called for it, a record yielded stays as
        it was; without it, the rings fill and the records travel by the pipes."""
        yielded = self._yielded[0]
        for worker in self._workers:
            spans, end = worker.spans, -1
            # In the ring's order: a record put after one not yet yielded (an entry handed
            # out again after a worker died) waits for it.
            while spans and spans[0][0] < yielded:
                end = spans.popleft()[1]
            if end >= 0 and worker.ring is not None:
                worker.ring.release(end)

    def __enter__(self) -> OrderedDecoding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self) -> None:
        """Idle workers told to end, busy ones killed (at once), none waited for."""
        for worker in self._workers:
            if not worker.stopped:
                worker.stopped = True
                if worker.tasks:
                    worker.kill()
                else:
                    with contextlib.suppress(OSError):
                        worker.tasks_conn.send(None)

    def close(self) -> None:
        """Stop every worker: idle ones are told to end, busy ones killed; all reaped."""
        self._stop()
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker.process.is_alive():
                worker.process.join(0.5)
            worker.kill()
            worker.reap()
        if self._heap_kept:
            self._heap_kept = False
            keep_the_heap(None)
        if self._frozen:
            self._frozen = False
            gc.unfreeze()


def decode_in_order(
    entries: Iterable[ListEntry],
    work: Callable[[ListEntry], Any],
    root: bytes,
    jobs: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> Iterator[tuple[ListEntry, Any]]:
    """:class:`OrderedDecoding` as a generator (the workers start when it does)."""
    with OrderedDecoding(entries, work, root, jobs, timeout=timeout) as decoding:
        yield from decoding


def _run(
    source: Iterator[ListEntry],
    workers: list[_Worker],
    context: Any,
    work: Callable[[ListEntry], Any],
    root: bytes,
    timeout: float,
    yielded: list[int],
    patience: float,
    keys: Callable[[ListEntry], bytes] | None = None,
) -> Iterator[tuple[ListEntry, Any] | Run]:
    """The parent's loop; ``yielded[0]``: the entries yielded so far."""
    # What is yielded from each entry on (``(entry, result)`` or a Run), the bytes it holds
    # and the entries it covers.
    ready: dict[int, tuple[Any, int, int]] = {}
    redo: deque[tuple[int, list[ListEntry]]] = deque()  # entries of a worker that died
    held = 0  # bytes in ready
    head = dispatched = 0
    head_since = time.monotonic()
    exhausted = False
    waiting = PipeWaiter()
    made = [0, 0]  # results received, their bytes
    chunk_size, ahead = CHUNK, AHEAD

    def next_task() -> tuple[int, list[ListEntry]] | None:
        nonlocal dispatched, exhausted
        if redo:
            return redo.popleft()
        if exhausted:
            return None
        chunk = list(islice(source, chunk_size))
        if len(chunk) < chunk_size:
            exhausted = True
        if not chunk:
            return None
        start = dispatched
        dispatched += len(chunk)
        return start, chunk

    def fail(worker: _Worker, reason: str) -> None:
        """``worker`` died or hung: replace it. Its results come a message at a time, so the
        entry at fault is known only in a task of one: a longer task's entries not yet
        received are handed out again one a task, and the one that fails alone is blamed."""
        worker.kill()
        worker.reap()
        workers[workers.index(worker)] = _Worker(context, work, root, patience, keys)
        if not worker.tasks:
            return
        start, chunk = worker.tasks.popleft()
        later = list(worker.tasks)
        seq = start + worker.received
        if len(chunk) == 1:
            entry = chunk[0]
            ready[seq] = ((entry, f"{shown_entry(root, entry)}: cannot read it: {reason}"), 0, 1)
            singles = []
        else:
            singles = [(i, [chunk[i - start]]) for i in range(seq, start + len(chunk))]
        redo.extendleft(reversed(singles + later))

    def receive(worker: _Worker) -> str | None:
        """One message of ``worker``'s results into ``ready``; else why there is none (its
        end of file, or a message that is not one)."""
        nonlocal held
        try:
            messages = receive_messages(worker.conn.fileno())
        except (EOFError, OSError):
            return ""
        except ValueError:
            return "its decoder sent a result that is not one (killed)"
        worker.since = time.monotonic()
        tasks, spans = worker.tasks, worker.spans
        for message in messages:
            try:
                results, size = unpack_results(message, worker.ring)
            except Exception:  # a garbled message: unpickling raises whatever it meets
                return "its decoder sent a result that is not one (killed)"
            count = len(results)
            for result, _, _ in results:
                if type(result) is Run:
                    count += result.count - 1
            if count > sum(len(chunk) for _, chunk in tasks) - worker.received:
                return "its decoder sent more results than it was given images (killed)"
            made[0] += count
            made[1] += size
            for result, size, end in results:
                start, chunk = tasks[0]
                at = worker.received
                seq = start + at
                if type(result) is Run:
                    # A run lies within one task (a worker's message ends with its task).
                    entries = chunk[at : at + result.count]
                    try:
                        if keys is None:
                            raise ValueError("a run of records without keys")
                        result.check(entries, list(map(keys, entries)))
                    except ValueError:
                        return "its decoder sent a result that is not one (killed)"
                    ready[seq] = (result, size, result.count)
                    worker.received += result.count
                else:
                    ready[seq] = ((chunk[at], result), size, 1)
                    if end >= 0:
                        spans.append((seq, end))
                    worker.received += 1
                held += size
                if worker.received == len(chunk):
                    tasks.popleft()
                    worker.received = 0
        return None

    while True:
        if made[0]:
            mean = made[1] // made[0] + 1
            chunk_size = max(4, min(CHUNK, TASK_BYTES // mean))
            ahead = max(2, min(AHEAD, AHEAD_BYTES // (mean * chunk_size)))
        # One task at a time to the worker with the fewest, so that work spreads evenly.
        while held < WINDOW_BYTES or redo:
            worker = min(workers, key=_queued)
            if len(worker.tasks) >= ahead:
                break
            task = next_task()
            if task is None:
                break
            if not worker.tasks:
                worker.since = time.monotonic()
            worker.tasks.append(task)
            try:
                # As plain tuples: pickled in C, without ListEntry's __reduce__.
                worker.tasks_conn.send(list(map(tuple, task[1])))
            except OSError:
                break  # it died: its sentinel says so, and its tasks are handed out again
        while head in ready:
            item, size, count = ready.pop(head)
            held -= size
            head += count
            yielded[0] = head
            yield item
            head_since = time.monotonic()
        if exhausted and not redo and head == dispatched:
            return
        holder = next((w for w in workers if w.next_seq() == head), None)
        deadline = None if holder is None else max(holder.since, head_since) + timeout
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        # The results of each worker with tasks (without room in the window, of the one
        # holding the next entry alone), and the sentinels of all with tasks.
        fds: dict[int, Any] = {}
        for w in workers:
            if w.tasks:
                if held < WINDOW_BYTES or w is holder:
                    fds[w.conn.fileno()] = w.conn
                fds[w.process.sentinel] = w.process.sentinel
        woken = waiting.wait(fds, left)
        if holder is not None and not woken and deadline is not None:
            if time.monotonic() >= deadline:
                fail(holder, _died(holder, timeout))
            continue
        for worker in list(workers):
            if worker.conn in woken:
                why = receive(worker)
                if why is None:
                    continue
            elif worker.process.sentinel in woken:
                why = None
                while why is None and worker.tasks and worker.conn.poll():
                    why = receive(worker)  # what it sent before it died
            else:
                continue
            worker.process.join(0 if why else 1)
            fail(worker, why or _died(worker, None))


def _queued(worker: _Worker) -> int:
    return len(worker.tasks)
