"""The writers: LMDB and LevelDB behind one small interface that takes key/value batches.

Writers are opened on a fresh directory (the staging directory of :mod:`mnist2db.conversion`)
and do not fsync per batch: the finished database is flushed once, by :meth:`Writer.close`,
before it is moved to its final name. Caffe's own options are kept (LMDB: a directory with
``data.mdb`` and ``lock.mdb``; LevelDB: 64 KiB blocks, 100 open files), but for LevelDB's
write buffer, sized to bound memory (:func:`leveldb_write_buffer`). Which writer a backend
uses is its :class:`~mnist2db.storage.databases.backends.Backend` entry's.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from mnist2db.errors import BackendError, backend_message
from mnist2db.fastpath import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from typing import Any

#: Caffe's LevelDB options (caffe/src/caffe/util/db_leveldb.cpp), but for the write buffer
#: (the memtable), which :func:`leveldb_write_buffer` sizes: the records are the same.
LEVELDB_OPTIONS: dict[str, Any] = {
    "block_size": 65536,
    "max_open_files": 100,
}
#: The largest memtable a writer uses. Caffe's 256 MiB holds two at once while the full one
#: is written out as a table (519 MiB peak RSS at 1,000,000 records); a memtable of this size
#: plus the interpreter stays under 150 MiB even then. Measured at 1,000,000 records
#: (docs/performance.md): 16, 32 and 48 MiB take the same time (the disk is the limit),
#: 56, 86 and 119 MiB peak RSS.
LEVELDB_MEMTABLE_MAX = 112 << 20
#: The memtable of a database larger than :data:`LEVELDB_MEMTABLE_MAX`, or of unknown size.
LEVELDB_MEMTABLE_STREAMING = 16 << 20

#: Mode for LMDB's files, as Caffe's ``mdb_env_open(..., 0664)``; the umask applies.
LMDB_FILE_MODE = 0o664

_MIN_MAP_SIZE = 64 << 20
#: Bytes at the end of an LMDB file being written that stay in the page cache (see
#: ``_Writeback``): its latest transactions' pages, which LMDB reads back (the records of
#: ``BATCH_BYTES``-bounded batches, twice over).
LMDB_CACHE_KEPT = 64 << 20


def _drain(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)


class Writer(Protocol):
    """Receives records in increasing key order, one batch per transaction."""

    def write_batch(
        self,
        items: Sequence[tuple[bytes, bytes]],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Write ``items`` in one transaction; ``before_commit()`` once they are in it."""

    def close(self) -> None:
        """Flush everything to disk and close; the database is then complete."""

    def abort(self) -> None:
        """Close without flushing; the caller discards the directory."""


class LmdbWriter:
    """Writes an LMDB environment, one transaction per batch, growing the map when full."""

    def __init__(
        self, path: str, size_hint: int, append: bool = True, existing: bool = False
    ) -> None:
        # existing: LMDB opens the environment there either way (a resumed conversion's).
        import lmdb

        self._lmdb = lmdb
        self.path = path
        self._append = append
        self.map_size = max(_MIN_MAP_SIZE, size_hint)
        try:
            self._env = lmdb.open(
                os.fsencode(path),
                map_size=self.map_size,
                subdir=True,
                # One fsync at the end (close) instead of one per commit: the database
                # lives under a temporary name until it is complete and flushed.
                sync=False,
                metasync=False,
                readahead=False,
                meminit=False,
                max_dbs=0,
                mode=LMDB_FILE_MODE,
            )
        except lmdb.Error as exc:
            raise BackendError(f"{path}: cannot create LMDB environment: {exc}") from exc
        self._writeback = _Writeback(path, "data.mdb", keep=LMDB_CACHE_KEPT)

    def write_batch(
        self,
        items: Sequence[tuple[bytes, bytes]],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self._write(items, before_commit)
        if items:
            self._writeback.wrote(len(items) * (len(items[0][0]) + len(items[0][1]) + 16))

    def _write(
        self, items: Sequence[tuple[bytes, bytes]], before_commit: Callable[[], None] | None
    ) -> None:
        lmdb = self._lmdb
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    consumed, added = txn.cursor().putmulti(items, append=self._append)
                    if before_commit is not None and added == len(items):
                        before_commit()
                if added != len(items):
                    raise BackendError(
                        f"{self.path}: LMDB stored {added} of {len(items)} records "
                        "(duplicate or out-of-order keys)"
                    )
                return
            except lmdb.MapFullError:
                # The transaction was aborted as a whole; double the map and redo it.
                self.map_size *= 2
                try:
                    self._env.set_mapsize(self.map_size)
                except lmdb.Error as exc:
                    raise BackendError(
                        f"{self.path}: cannot grow LMDB map to {self.map_size} bytes: {exc}"
                    ) from exc
            except lmdb.Error as exc:
                raise BackendError(f"{self.path}: LMDB write failed: {exc}") from exc

    def close(self) -> None:
        self._writeback.close()
        try:
            self._env.sync(True)
            self._env.close()
        except self._lmdb.Error as exc:
            raise BackendError(f"{self.path}: LMDB flush failed: {exc}") from exc

    def abort(self) -> None:
        self._writeback.close()
        self._env.close()


class _Writeback:
    """Starts the kernel writing the database's dirty pages to disk every few MiB, unwaited;
    with ``keep``, also lets go of the pages of the file more than ``keep`` bytes before
    its end once they are on disk.

    The writers do not sync per batch, so without this all the data waits for the final
    fsync, which then takes as long as the disk needs for the whole database. Started
    early, that writing overlaps the conversion and the final fsync (still the one that
    makes the database durable) has little left to do.

    Letting go (``posix_fadvise(DONTNEED)`` of pages already written): the kernel then
    takes the pages for the next batch's writes from those just freed, instead of fresh
    memory. Fresh memory costs most of a large conversion's writes where the kernel must
    first zero it, or where a virtual machine's host must first supply it (on this
    project's test machine, whose free memory the host reclaims within seconds, filling
    the page cache with 400 MB took 0.9-1.2 s of system time, recycling it 0.2-0.4 s:
    docs/performance.md). LMDB reads back only the pages of its latest transactions
    (the tree's right edge), which ``keep`` leaves cached; the last ``keep`` bytes stay
    cached. Linux only (sync_file_range); elsewhere, and on any failure, this does
    nothing.

    Args:
        directory: the database directory.
        suffix: which of its files to write back (``data.mdb``; ``.log`` for LevelDB).
        keep: bytes at the end of each file left in the page cache (None: all of it).
    """

    EVERY = 4 << 20
    _SYNC_FILE_RANGE_WRITE = 2
    _SYNC_FILE_RANGE_WAITED = 1 | 2 | 4  # wait for earlier writes, write, wait

    def __init__(self, directory: str, suffix: str, keep: int | None = None) -> None:
        self._directory = directory
        self._suffix = suffix
        self._keep = keep
        self._pending = 0
        self._fds: dict[str, int] = {}
        self._dropped: dict[str, tuple[int, int]] = {}  # let go: once, twice (bytes)
        self._func: Any = None
        if not hasattr(os, "posix_fadvise"):  # not Linux-like: skip quietly
            return
        try:
            import ctypes

            func = ctypes.CDLL(None, use_errno=True).sync_file_range
        except (OSError, AttributeError):
            return
        func.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        self._func = func

    def wrote(self, size: int) -> None:
        self._pending += size
        if self._pending < self.EVERY or self._func is None:
            return
        self._pending = 0
        try:
            for entry in os.scandir(self._directory):
                if entry.name.endswith(self._suffix) and entry.name not in self._fds:
                    self._fds[entry.name] = os.open(entry.path, os.O_RDONLY)
        except OSError:
            self.close()
            return
        for name, fd in self._fds.items():
            if self._func(fd, 0, 0, self._SYNC_FILE_RANGE_WRITE) != 0:
                self.close()  # not supported here: stop trying
                return
            if self._keep is not None:
                self._let_go(name, fd, self._keep)

    def _let_go(self, name: str, fd: int, keep: int) -> None:
        """The pages of ``fd`` before its last ``keep`` bytes, once on disk, out of the
        page cache. Each range is let go twice, now and at the next call: a page a
        process still maps stays cached, and LMDB's map holds those it read in the batch
        just written until the caller lets go of them (the imageset's writer does, after
        each batch); a page written again later stays."""
        start, done = self._dropped.get(name, (0, 0))
        try:
            end = (os.fstat(fd).st_size - keep) // self.EVERY * self.EVERY
            if end - done < self.EVERY:
                return
            if self._func(fd, done, end - done, self._SYNC_FILE_RANGE_WAITED) != 0:
                return
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:
            return
        self._dropped[name] = (done, end)

    def close(self) -> None:
        self._func = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def leveldb_write_buffer(size_hint: int) -> int:
    """The memtable size for a database of :func:`size_hint` ``size_hint``: large enough to
    hold all of it when that fits under :data:`LEVELDB_MEMTABLE_MAX`, else
    :data:`LEVELDB_MEMTABLE_STREAMING`.

    A database held in one memtable is never written out as tables by the writer: each
    table LevelDB writes is fsynced, and on Fashion-MNIST's training set the flushes of
    8 to 56 MiB memtables took 3 to 8 times the whole conversion with one memtable
    (docs/performance.md). The memtable's arena takes about 1.3 times the keys and values
    (4 KiB blocks, a record of 800 bytes leaves the rest of a block unused).
    """
    data = max(0, size_hint - (16 << 20)) // 2  # size_hint's own inverse: keys and values
    need = data * 13 // 10 + (1 << 20)
    return need if data > 0 and need <= LEVELDB_MEMTABLE_MAX else LEVELDB_MEMTABLE_STREAMING


class LeveldbWriter:
    """Writes a LevelDB database with Caffe's options, one write batch per batch, its
    memtable sized by :func:`leveldb_write_buffer` (memory bounded at any size)."""

    def __init__(
        self, path: str, size_hint: int = 0, append: bool = True, existing: bool = False
    ) -> None:
        # append: LevelDB sorts what it is given; the keys' order is the caller's promise
        # only to LMDB. existing: continue the database there (a resumed conversion's).
        import plyvel

        self._plyvel = plyvel
        self.path = path
        self.write_buffer_size = leveldb_write_buffer(size_hint)
        try:
            self._db = plyvel.DB(
                os.fsencode(path),
                create_if_missing=True,
                error_if_exists=not existing,
                write_buffer_size=self.write_buffer_size,
                **LEVELDB_OPTIONS,
            )
        except plyvel.Error as exc:
            raise BackendError(
                f"{path}: cannot create LevelDB database: {backend_message(exc)}"
            ) from exc
        self._writeback = _Writeback(path, ".log")

    def write_batch(
        self,
        items: Sequence[tuple[bytes, bytes]],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        try:
            with self._db.write_batch() as batch:
                # starmap drained by a zero-length deque: the loop runs in C.
                _drain(itertools.starmap(batch.put, items))
                if before_commit is not None:
                    before_commit()
        except self._plyvel.Error as exc:
            raise BackendError(
                f"{self.path}: LevelDB write failed: {backend_message(exc)}"
            ) from exc
        if items:
            self._writeback.wrote(len(items) * (len(items[0][0]) + len(items[0][1]) + 16))

    def close(self) -> None:
        self._writeback.close()
        try:
            # A synced empty write flushes LevelDB's log; the files are fsynced by the caller.
            self._db.write_batch(sync=True).write()
            self._db.close()
        except self._plyvel.Error as exc:
            raise BackendError(
                f"{self.path}: LevelDB flush failed: {backend_message(exc)}"
            ) from exc

    def abort(self) -> None:
        self._writeback.close()
        self._db.close()
