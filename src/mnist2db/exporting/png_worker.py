"""Raw grey records' PNGs encoded in a second process, while the export frames, writes and
hashes in its own (``export --to webdataset`` of raw records).

The PNG encoder (:func:`mnist2db.formats.png.encoder.encode_png_batch`, the one ``convert
--encoded png`` uses) is numpy steps that hold the GIL: in one interpreter it cannot
overlap the export's framing, and a shard export of raw records ran on one core. A
:class:`PngWorker` is a process forked at the start of the export, before its threads,
that reads batches of images from a pipe and writes back their PNGs: the same encoder,
the same bytes. The export hands it batches while it is free and encodes the others
itself (:func:`mnist2db.exporting.sample_batches.iter_batches`), so both cores encode.

One request at a time, through one thread of the parent (a pipe each way: the worker
reads a whole request before it writes its answer, so neither side waits on a full pipe
of the other). The worker never touches the database (an LMDB environment is never used
across fork: the readers close theirs in a child) nor any file; it ignores SIGINT (an
interruption is the parent's business) and ends when its request pipe closes: when the
export ends, however it ends (a killed parent's end of the pipe closes with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from mnist2db.errors import Mnist2dbError
from mnist2db.exporting.pipe_io import read_exact, write_all
from mnist2db.process_setup import widen_pipes

#: A request's head: images, rows, columns (the pixels follow); an answer's: "K" and the
#: PNGs' total size (their sizes as uint32, then the PNGs, follow) or "E" and a message.
_REQUEST = struct.Struct("<QII")
_ANSWER = struct.Struct("<cQ")
_PIPE = "the PNG encoding process"  # named when its pipe ends early
#: Requests handed to the worker and not answered, at most (the rest are encoded here).
IN_FLIGHT = 2


def worth_a_worker() -> bool:
    """True where a second process can run beside this one (two CPUs or more for us)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) >= 2


class PngWorker:
    """The encoding process and the parent's thread that talks to it. ``encode`` (in the
    parent: a function of ``(n, rows, cols)`` uint8 images to their PNGs) is what the worker
    runs on each request."""

    def __init__(self, encode: Any) -> None:
        self.in_flight = 0
        self.answered = 0  # batches the worker encoded
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            status = 1
            try:
                os.close(requests_w)
                os.close(answers_r)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _serve(requests_r, answers_w, encode)
                status = 0
            finally:
                os._exit(status)
        os.close(requests_r)
        os.close(answers_w)
        widen_pipes(requests_w, answers_r)  # a batch's pixels (784 KB of 28 x 28) in one write
        self.pid, self.requests, self.answers = pid, requests_w, answers_r
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mnist2db-png")

    def free(self) -> bool:
        """True while fewer than :data:`IN_FLIGHT` requests wait for the worker."""
        return self.in_flight < IN_FLIGHT

    def submit(self, task: Any, *args: Any) -> Future[Any]:
        """Run ``task(*args, self.encode_remote)`` on the parent's thread that talks to the
        worker (``task`` encodes its grey images with the function it is given last)."""
        self.in_flight += 1
        future = self.pool.submit(lambda: task(*args, self.encode_remote))
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Future[Any]) -> None:
        self.in_flight -= 1

    def encode_remote(self, images: np.ndarray) -> list[bytes]:
        """The PNGs of ``images`` (uint8, ``(n, rows, cols)``), encoded by the worker."""
        n, rows, cols = images.shape
        try:
            write_all(self.requests, _REQUEST.pack(n, rows, cols))
            # From where they are (a contiguous batch: made so when the records were read).
            write_all(self.requests, np.ascontiguousarray(images).data.cast("B"))
            kind, size = _ANSWER.unpack(read_exact(self.answers, _ANSWER.size, _PIPE))
            if kind != b"K":
                message = read_exact(self.answers, size, _PIPE).decode("utf-8", "replace")
                raise Mnist2dbError(f"the PNG encoding process failed: {message}")
            sizes = np.frombuffer(read_exact(self.answers, 4 * n, _PIPE), np.uint32)
            body = read_exact(self.answers, size, _PIPE)
        except (EOFError, BrokenPipeError):
            raise Mnist2dbError(
                f"the PNG encoding process (pid {self.pid}) ended before the export"
            ) from None
        self.answered += 1
        ends = np.cumsum(sizes).tolist()
        return [body[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]

    def kill(self) -> None:
        """End the worker at once, stopped (SIGSTOP) or not, and reap it (once): a request
        in progress then fails (its pipe ends), so no thread waits for it any more."""
        if self.pid <= 0:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # a stopped process ends too
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.pid = -self.pid

    def close(self, abort: bool = False) -> None:
        """Wait for the request in progress, end the worker and reap it; with ``abort`` (the
        export failed or was interrupted), or when waiting is interrupted, killed at once:
        an interruption never waits for a worker that does not answer (stopped)."""
        ended = False
        try:
            if not abort and self.pid > 0:
                self.pool.shutdown(wait=True)
                os.close(self.requests)  # the worker reads the end of its pipe and exits
                self.requests = -1
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                self.pid = -self.pid
                ended = True
        finally:
            if not ended:
                self.kill()
                self.pool.shutdown(wait=True, cancel_futures=True)
                if self.requests >= 0:
                    os.close(self.requests)
                    self.requests = -1
            if self.answers >= 0:
                os.close(self.answers)
                self.answers = -1


def _serve(requests: int, answers: int, encode: Any) -> None:
    """The worker's loop: a request, its answer, until the request pipe ends."""
    while True:
        try:
            head = read_exact(requests, _REQUEST.size, _PIPE)
        except EOFError:
            return
        n, rows, cols = _REQUEST.unpack(head)
        pixels = read_exact(requests, n * rows * cols, _PIPE)
        try:
            pngs = encode(np.frombuffer(pixels, np.uint8).reshape(n, rows, cols))
        except Exception as exc:  # handed to the parent, raised there
            message = str(exc).encode("utf-8", "replace")
            write_all(answers, _ANSWER.pack(b"E", len(message)) + message)
            continue
        sizes = np.array([len(png) for png in pngs], np.uint32)
        body = b"".join(pngs)
        write_all(answers, _ANSWER.pack(b"K", len(body)) + sizes.tobytes())
        write_all(answers, body)
