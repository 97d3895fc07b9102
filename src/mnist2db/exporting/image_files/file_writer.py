"""``export --to files``' small files created by a second process, while the export reads
records, encodes PNGs and writes its list in its own.

A file is created in three system calls (``open``, ``write``, ``close``) around a few
microseconds of Python; in the export's interpreter each call gives up the GIL and waits
for it again behind the thread that decodes and encodes the next batch (numpy steps that
hold it), so the file creations, the encoding and the kernel's work for each file ran one
after another on one core. A :class:`FileWriter` is a process forked at the start of the
tree's writing, before the export's threads, that takes batches of samples through a pipe,
places each (:func:`mnist2db.exporting.image_files.folder.place_batch`: the same names, the same
``O_EXCL`` creations inside the staging directory) and writes back where each went. It is
the only one creating files while it has batches: they are placed one after another, in
key order, as the export alone would place them; the export places a batch itself (one of
large files, where the pipe's copies would cost more than they spare) only once the
process has answered every batch before it.

One request at a time, through one thread of the parent (a pipe each way: the process reads
a whole request before it writes its answer, so neither side waits on a full pipe of the
other). After an error (a full disk: the ``OSError`` naming the file) it answers every
later request with the same error and creates nothing more. It never touches the database
(an LMDB environment is never used across fork) nor anything outside the tree; it ignores
SIGINT (an interruption is the parent's business) and ends when its request pipe closes:
when the export ends, however it ends (a killed parent's end of the pipe closes with it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mnist2db.errors import Mnist2dbError, OutputError
from mnist2db.exporting.pipe_io import read_exact, write_all
from mnist2db.exporting.samples import SampleBatch
from mnist2db.process_setup import widen_pipes

#: A request's head: the sizes of its pickled fields and of its files' bytes (which follow,
#: joined); an answer's: the size of its pickled result.
_REQUEST = struct.Struct("<QQ")
_ANSWER = struct.Struct("<Q")
_PIPE = "the file-writing process"  # named when its pipe ends early
#: Batches handed to the process and not answered, at most (memory's bound).
IN_FLIGHT = 2
#: A batch whose files average more than this is placed by the export itself: its bytes
#: would be copied twice more through the pipe (the creation of a large file is its copy).
SMALL_FILES = 16 << 10

_PR_SET_PDEATHSIG = 1

#: What the process runs on each batch: ``(batch, index of its first record)`` to a result
#: the parent receives (pickled).
PlaceBatch = Callable[[SampleBatch, int], Any]


def small_files(batch: SampleBatch) -> bool:
    """True when ``batch``'s files are small enough to be worth the process."""
    return sum(len(data) for data in batch.data) <= SMALL_FILES * len(batch.data)


class FileWriter:
    """The file-creating process and the parent's thread that talks to it; ``place`` (in
    the parent, run in the process) places one batch; ``out``: the tree an error names."""

    def __init__(self, place: PlaceBatch, out: str) -> None:
        self.out = out  # what an error names
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the process: never returns
            status = 1
            try:
                os.close(requests_w)
                os.close(answers_r)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _end_with(parent)
                _serve(requests_r, answers_w, place)
                status = 0
            finally:
                os._exit(status)
        os.close(requests_r)
        os.close(answers_w)
        widen_pipes(requests_w, answers_r)  # a batch in a few writes, not one a page
        self.pid, self.requests, self.answers = pid, requests_w, answers_r
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mnist2db-files")

    def submit(self, batch: SampleBatch, start: int) -> Future[Any]:
        """Have the process place ``batch`` (its first record the export's ``start``); the
        future gives ``place``'s result, or raises its error (an ``OSError`` as raised)."""
        sizes = [len(data) for data in batch.data]
        fields = pickle.dumps(
            (start, batch.keys, batch.labels, batch.exts, batch.encoded, sizes),
            pickle.HIGHEST_PROTOCOL,
        )
        body = b"".join(batch.data)
        return self.pool.submit(self._exchange, fields, body)

    def _exchange(self, fields: bytes, body: bytes) -> Any:
        try:
            write_all(self.requests, _REQUEST.pack(len(fields), len(body)) + fields)
            write_all(self.requests, body)
            (size,) = _ANSWER.unpack(read_exact(self.answers, _ANSWER.size, _PIPE))
            made, result = pickle.loads(read_exact(self.answers, size, _PIPE))
        except (EOFError, BrokenPipeError):
            raise OutputError(
                f"{self.out}: the process creating its files (pid {self.pid}) ended before "
                "the export"
            ) from None
        if not made:
            raise result
        return result

    def close(self, abort: bool = False) -> None:
        """End the process and reap it: once this returns, nothing creates files in the
        tree any more. Normally after its last answer (the end of its request pipe ends
        it); with ``abort`` (the export failed: its tree is about to be removed), or when
        waiting is interrupted, killed at once, whatever batch it is placing. The pipes
        are closed only once the parent's thread is done with them (a descriptor closed
        under a write in progress could be another file's by the next write)."""
        ended = False
        try:
            if not abort:
                self.pool.shutdown(wait=True)  # its last batch answered
                os.close(self.requests)
                self.requests = -1
                os.waitpid(self.pid, 0)
                ended = True
        finally:
            if not ended:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                # Its pipes' other ends are gone: an exchange in progress ends with an error.
                self.pool.shutdown(wait=True, cancel_futures=True)
                if self.requests >= 0:
                    os.close(self.requests)
            os.close(self.answers)


def _end_with(parent: int) -> None:
    """Have the kernel kill this process when the export's thread that forked it ends
    (Linux's ``PR_SET_PDEATHSIG``): a killed export's process would otherwise finish its
    batch in a staging directory the next export may be removing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # ended before the request was made
        os._exit(1)


def _serve(requests: int, answers: int, place: PlaceBatch) -> None:
    """The process's loop: a request, its answer, until the request pipe ends."""
    failed: BaseException | None = None
    while True:
        try:
            head = read_exact(requests, _REQUEST.size, _PIPE)
        except EOFError:
            return
        fields_size, body_size = _REQUEST.unpack(head)
        start, keys, labels, exts, encoded, sizes = pickle.loads(
            read_exact(requests, fields_size, _PIPE)
        )
        body = memoryview(read_exact(requests, body_size, _PIPE))
        answer: tuple[bool, Any]
        if failed is None:
            data: list[bytes | memoryview] = []
            offset = 0
            for size in sizes:
                data.append(body[offset : offset + size])
                offset += size
            try:
                answer = (True, place(SampleBatch(keys, labels, data, exts, encoded), start))
            except Exception as exc:  # handed to the parent, raised there
                failed = exc
        if failed is not None:
            answer = (False, _picklable(failed))
        payload = pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
        write_all(answers, _ANSWER.pack(len(payload)) + payload)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` itself when it survives pickling (an ``OSError`` keeps its errno, text and
    file name; our errors their message), else an error of its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return Mnist2dbError(str(exc))
    return exc
