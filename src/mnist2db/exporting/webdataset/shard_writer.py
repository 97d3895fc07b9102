"""WebDataset shards written, hashed and committed on three threads, beside the caller.

The caller (:mod:`mnist2db.exporting.webdataset.shards`) frames samples
(:func:`~mnist2db.exporting.webdataset.tar_members.batch_tars`); a :class:`ShardFile` gathers them into
writes of about :data:`WRITE_SIZE` bytes, each a list of buffers: small members joined,
and a large one (an encoded record's bytes, as the batch holds them) left where it
is. Each write goes to two threads, in order: one writes it (copied once, into the
aligned buffer of a :class:`~mnist2db.storage.direct_writes.DirectWriter`, and written
past the page cache where the file system allows: the shard is fsynced before its rename
anyway), the other feeds the shard's SHA-256 with the same bytes joined into one buffer
(OpenSSL, the GIL released); the two run at once while the caller frames the next samples.
One update a write, not one a buffer: a thread that lets go of the GIL gets it back only
when the thread holding it gives it up, after up to the interpreter's switch interval
(5 ms), and the framing and reading threads hold it most of the time, so an update of
each 40 KB image (30 µs of hashing) ran at the pace of the waits, the hash one image
behind another, the whole export on about one core. A third commits
each finished shard (fsync, rename) while the next one is written. At most
:data:`WRITES_AHEAD` bytes wait for either thread (memory's bound); an error on either is
raised by a later submit or by :meth:`Workers.drain`, and a shard is committed only when
every write before its commit was made and hashed."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mnist2db.errors import OutputExistsError
from mnist2db.exporting.webdataset.tar_members import END_OF_ARCHIVE, VIEW_SIZE
from mnist2db.storage.direct_writes import DirectWriter
from mnist2db.storage.files import AtomicFile

#: Bytes gathered before a write is handed to the threads (and hashed in one update).
WRITE_SIZE = 4 << 20
#: Bytes handed to a thread and not yet done, at most (memory's bound: one write more, a
#: sample larger than that, may wait).
WRITES_AHEAD = 16 << 20


class _Skipped(Exception):
    """A task not run: the workers are closing."""


class _Ordered:
    """One thread running tasks in the order given; after an error, or once closing, the
    tasks left are skipped, their futures raising that error (or :class:`_Skipped`): a
    task of the other thread waiting for one of them fails with the error itself."""

    def __init__(self, name: str) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.pending: deque[tuple[Future[Any], int]] = deque()
        self.pending_size = 0
        self.stopped = False
        self.error: BaseException | None = None

    def _run(self, task: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self.stopped:
            raise self.error or _Skipped()
        try:
            return task(*args)
        except BaseException as exc:
            self.error, self.stopped = self.error or exc, True
            raise

    def submit(self, task: Callable[..., Any], *args: Any, size: int = 0) -> Future[Any]:
        """Hand ``task(*args)`` (of ``size`` bytes) to the thread; wait first while more than
        :data:`WRITES_AHEAD` bytes are waiting."""
        while self.pending and (self.pending[0][0].done() or self.pending_size > WRITES_AHEAD):
            self._wait()
        future = self.pool.submit(self._run, task, args)
        self.pending.append((future, size))
        self.pending_size += size
        return future

    def _wait(self) -> None:
        future, size = self.pending.popleft()
        self.pending_size -= size
        future.result()

    def drain(self) -> None:
        while self.pending:
            self._wait()


class Workers:
    """The threads of an export's shards: one writes, one hashes, one commits (fsync and
    rename: a shard reaches the disk while the next one is written)."""

    def __init__(self) -> None:
        self.writer = _Ordered("mnist2db-shards")
        self.hasher = _Ordered("mnist2db-sha256")
        self.committer = _Ordered("mnist2db-commit")
        self.files: list[AtomicFile] = []
        self.direct = DirectWriter()  # the writing thread's, one shard after another

    def wait_commits(self) -> None:
        """Wait for the shards finished so far to be committed; raise the first error."""
        self.committer.drain()

    def drain(self) -> None:
        """Wait for every task; raise the first error."""
        for worker in (self.hasher, self.writer, self.committer):
            worker.drain()

    def close(self) -> None:
        """Skip the tasks not begun, wait for those running, and remove the temporary of
        every shard not committed."""
        workers = (self.writer, self.hasher, self.committer)
        for worker in workers:
            worker.stopped = True
        for worker in workers:
            worker.pool.shutdown(wait=True)
            worker.pending.clear()
        for file in self.files:
            file.discard()
        self.direct.close()


def folder_identity(path: str) -> tuple[int, int] | None:
    """The device and inode of directory ``path`` (not through a link); None if it is not
    one (a link the user named as OUT's folder: theirs)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


class ShardFile:
    """One shard being written: an :class:`AtomicFile`, its SHA-256, its count and keys."""

    def __init__(
        self,
        path: str,
        workers: Workers,
        replace: bool = False,
        folder: tuple[int, int] | None = None,
    ) -> None:
        self.path = path
        self.workers = workers
        self.replace = replace  # True: over a shard of ours; else nothing may be there
        self.folder = folder  # the folder's identity (folder_identity) it is renamed within
        self.file = AtomicFile(path).create()
        workers.files.append(self.file)
        self.fd = self.file.stream.fileno()  # written by workers.direct, never through the stream
        workers.writer.submit(workers.direct.start, self.fd)
        self.digest = hashlib.sha256()
        self.count = 0
        self.size = 0
        self.first: bytes | None = None
        self.last = b""
        self.buffers: list[Any] = []  # the next write's, beside the small pieces being joined
        self.small: list[Any] = []
        self.pending_size = 0

    def add(self, first: bytes, last: bytes, count: int, size: int, pieces: list[Any]) -> None:
        """Add ``count`` samples (keys ``first`` to ``last``), their ``size`` bytes in the tar
        as ``pieces`` (:meth:`~mnist2db.exporting.webdataset.tar_members.FramedBatch.pieces`)."""
        for piece in pieces:
            if len(piece) >= VIEW_SIZE:  # written and hashed from where it is
                if self.small:
                    self.buffers.append(b"".join(self.small))
                    self.small = []
                self.buffers.append(piece)
            else:
                self.small.append(piece)
        self.pending_size += size
        self.size += size
        self.count += count
        if self.first is None:
            self.first = first
        self.last = last
        if self.pending_size >= WRITE_SIZE:
            self._flush()

    def _flush(self, end: bytes = b"") -> Future[None]:
        self.small.append(end)
        self.buffers.append(b"".join(self.small))
        buffers, size = self.buffers, self.pending_size
        self.buffers, self.small, self.pending_size = [], [], 0
        self.workers.hasher.submit(self._hash, buffers, size=size)
        return self.workers.writer.submit(self._write, buffers, bool(end), size=size)

    def _write(self, buffers: list[Any], last: bool) -> None:
        """Write ``buffers`` in order (:class:`~mnist2db.storage.direct_writes.DirectWriter`),
        and the staged tail when ``last``; a failure (a full disk) names the shard."""
        try:
            self.workers.direct.write(buffers)
            if last:
                self.workers.direct.end()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None

    def _hash(self, buffers: list[Any]) -> None:
        # One update (the GIL let go of once): the join costs a copy, ~1 ms for 4 MiB.
        self.digest.update(b"".join(buffers) if len(buffers) > 1 else buffers[0])

    def finish(self, done: Callable[[dict[str, Any]], None]) -> None:
        """End the shard; once its bytes are written and hashed, commit it (fsync, rename,
        on the committing thread) and call ``done`` there with its manifest entry."""
        end = END_OF_ARCHIVE
        self.size += len(end)
        self.pending_size += len(end)
        written = self._flush(end)
        hashed = self.workers.hasher.submit(self.digest.hexdigest)
        self.workers.committer.submit(self._commit, written, hashed, done)

    def _commit(
        self, written: Future[None], hashed: Future[str], done: Callable[[dict[str, Any]], None]
    ) -> None:
        written.result()  # the other threads never wait for this one
        sha256 = hashed.result()
        where = os.path.dirname(self.path) or os.curdir
        if folder_identity(where) != self.folder:  # a link put in the folder's place
            raise OSError(errno.ELOOP, "no longer the folder it was (a link?)", where)
        try:
            self.file.commit(replace=self.replace)
        except FileExistsError:
            raise OutputExistsError(
                f"{self.path}: appeared while exporting, not a shard of this export; "
                "refusing to replace it"
            ) from None
        done(
            {
                "name": os.path.basename(self.path),
                "records": self.count,
                "bytes": self.size,
                "sha256": sha256,
                "first_key_hex": (self.first or b"").hex(),
                "last_key_hex": self.last.hex(),
            }
        )
