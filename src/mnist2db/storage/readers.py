"""Readers of finished LMDB and LevelDB databases: one handle per database per process,
correct under fork, spawn, forkserver and threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Any

import lmdb
import plyvel

from mnist2db.errors import BackendError, DatumError
from mnist2db.formats.datum import decode_datum, key_text
from mnist2db.storage.backends import backend_message, check_backend, detect_backend

# -- readers ---------------------------------------------------------------------------------
#
# One design for every way a process can use a database (written once, here):
# * One handle per database per process, shared by every reader open on it (open_db,
#   open_reader, iter_db, info, verify, export, show): py-lmdb refuses a second environment
#   on the same files in one process, and LevelDB a second open. The table is guarded by a
#   lock, so threads opening the same database at once share one handle.
# * LMDB is opened read-only with lock=False: a finished database never changes, so readers
#   need no reader table. Nothing is written to lock.mdb (read-only media work as any other),
#   a killed worker leaves no stale reader slot, and max_readers does not apply (any number
#   of processes and threads read at once). readahead=False: random access to a database
#   larger than the page cache then reads only the pages it needs.
#   Each thread reads through one long-lived read transaction of its own (LMDB transactions
#   belong to one thread); with no writer, a long transaction costs nothing.
# * fork(): LMDB's rule is that an environment is never used across fork. In the child,
#   every inherited LMDB environment is closed (harmless with lock=False: there are no reader
#   slots to clear) and reopened on first use. A LevelDB handle cannot be shared by two
#   processes and LevelDB admits one process at a time, so a forked child does not read
#   through it: its first read raises BackendError saying what to do. The inherited handle
#   is never closed nor freed in the child (closing waits for LevelDB's background thread,
#   which does not exist after fork).
# * spawn/forkserver: a pickled dataset carries no handle and opens its own in the worker.

#: py-lmdb's options for reading a finished database (see above).
LMDB_READ_OPTIONS: dict[str, Any] = {
    "readonly": True,
    "lock": False,
    "readahead": False,
    "subdir": True,
    "max_dbs": 0,
}

_LEVELDB_HINT = (
    "LevelDB admits one process at a time: read it with num_workers=0 (in the process "
    "that opened it), or convert it to LMDB (mnist2db convert --backend lmdb), which any "
    "number of processes can read"
)


def held_elsewhere(reason: str) -> bool:
    """True if LevelDB's ``reason`` for not opening is another process holding its lock."""
    return "lock" in reason.lower() and "temporarily unavailable" in reason.lower()


class _Handle:
    """One open database in this process (see the design notes above)."""

    def __init__(self, path: str, backend: str) -> None:
        self.path = path
        self.backend = backend
        self.users = 0
        self.forked_from: int | None = None  # LevelDB: the pid that opened it, in a child
        self._env: Any = None
        self._db: Any = None
        self._local = threading.local()
        self._open_lock = threading.Lock()
        if backend == "lmdb":
            self._open_lmdb()
        elif backend == "leveldb":
            self._open_leveldb()
        else:
            check_backend(backend)
        self.pid = os.getpid()

    def _open_lmdb(self) -> None:
        try:
            self._env = lmdb.open(os.fsencode(self.path), **LMDB_READ_OPTIONS)
        except lmdb.Error as exc:
            raise BackendError(
                f"{self.path}: cannot open LMDB database: {backend_message(exc)}"
            ) from exc

    def _open_leveldb(self) -> None:
        try:
            # LevelDB has no read-only mode: opening may write its log into a table file and
            # compact (the README says so); the records do not change.
            self._db = plyvel.DB(os.fsencode(self.path), create_if_missing=False)
        except plyvel.Error as exc:
            text = backend_message(exc)
            hint = ""
            # EAGAIN on LOCK: another process holds the database ("already held by process"
            # cannot happen here: the table opens each database once per process).
            if held_elsewhere(text):
                # Named first: `mnist2db info` users have no DataLoader to tune.
                hint = f" (another process has it open; {_LEVELDB_HINT})"
            raise BackendError(f"{self.path}: cannot open LevelDB database: {text}{hint}") from exc

    # -- fork --------------------------------------------------------------------------------

    def after_fork_in_child(self, parent: int) -> None:
        # The same local object (datasets hold it), emptied: after fork only this thread is
        # left, and its transaction belongs to the parent's environment.
        with contextlib.suppress(AttributeError):
            del self._local.txn
        self._open_lock = threading.Lock()
        if self.backend == "lmdb":
            env, self._env = self._env, None
            if env is not None:
                with contextlib.suppress(Exception):
                    env.close()
        else:
            if self._db is not None:
                _keep_forever(self._db)
            self._db = None
            self.forked_from = parent

    # -- reading -----------------------------------------------------------------------------

    def txn(self) -> Any:
        """This thread's read transaction (LMDB)."""
        try:
            return self._local.txn
        except AttributeError:
            pass

        with self._open_lock:
            if self._env is None:
                self._open_lmdb()
        try:
            txn = self._local.txn = self._env.begin(buffers=False)
        except lmdb.Error as exc:
            raise BackendError(f"{self.path}: LMDB read failed: {backend_message(exc)}") from exc
        return txn

    def db(self) -> Any:
        """The LevelDB database object."""
        if self._db is None:
            if self.forked_from is not None:
                raise BackendError(
                    f"{self.path}: this LevelDB database was opened by process "
                    f"{self.forked_from} before it forked this one; {_LEVELDB_HINT}"
                )
            raise BackendError(f"{self.path}: the database is closed")
        return self._db

    def close(self) -> None:
        if self.backend == "lmdb":
            if self._env is not None:
                self._env.close()
        elif self._db is not None:
            self._db.close()
        self._env = self._db = None


def _keep_forever(obj: object) -> None:
    """Leak a reference so ``obj`` is never freed (a LevelDB handle inherited by fork)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


#: (real path, backend, st_dev, st_ino of the directory) -> the process's handle on it.
_HANDLES: dict[tuple[str, str, int, int], _Handle] = {}
# Re-entrant: a dataset freed by the garbage collector while this thread holds the lock
# (inside _acquire) releases its handle from within.
_HANDLES_LOCK = threading.RLock()


def _after_fork_in_child() -> None:
    global _HANDLES_LOCK
    _HANDLES_LOCK = threading.RLock()  # another thread may have held it at fork time
    parent = os.getppid()
    for handle in _HANDLES.values():
        handle.after_fork_in_child(parent)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _acquire(path: str, backend: str) -> _Handle:
    # The directory's identity is part of the key: a database replaced under the same name
    # (convert --overwrite) is another database, and gets a handle of its own.
    try:
        status = os.stat(path)
    except OSError as exc:
        raise BackendError(f"{path}: cannot open database: {exc.strerror}") from None
    key = (os.path.realpath(path), backend, status.st_dev, status.st_ino)
    with _HANDLES_LOCK:
        handle = _HANDLES.get(key)
        if handle is None:
            handle = _HANDLES[key] = _Handle(path, backend)
        handle.users += 1
        return handle


def _release(handle: _Handle) -> None:
    with _HANDLES_LOCK:
        handle.users -= 1
        if handle.users > 0 or handle.forked_from is not None:
            # A LevelDB handle inherited by fork stays in the table: opening the database
            # again in this process would fail on the lock the parent holds, without a hint.
            return
        for key, found in list(_HANDLES.items()):
            if found is handle:
                del _HANDLES[key]
        handle.close()


class DbReader:
    """A finished database opened read-only: ``len()``, ``get(key)``, and iteration in key order.

    Readers of one database in one process share one handle (see the notes above), so any
    number may be open at once, in any thread; each :meth:`close` releases its share.
    """

    def __init__(self, path: str | os.PathLike[str], backend: str | None = None) -> None:
        self.path = os.fspath(path)
        self.backend = backend or detect_backend(self.path)
        check_backend(self.backend)
        self._handle: _Handle | None = _acquire(self.path, self.backend)

    @property
    def handle(self) -> _Handle:
        if self._handle is None:
            raise BackendError(f"{self.path}: the reader is closed")
        return self._handle

    def _failed(self, exc: Exception) -> BackendError:
        return BackendError(f"{self.path}: {self.backend} read failed: {backend_message(exc)}")

    def _errors(self) -> tuple[type[Exception], ...]:
        if self.backend == "lmdb":
            return (lmdb.Error,)

        return (plyvel.Error,)

    def __len__(self) -> int:
        if self.backend == "lmdb":
            try:
                return int(self.handle.txn().stat()["entries"])
            except self._errors() as exc:
                raise self._failed(exc) from exc
        return sum(1 for _ in self.iter_keys())

    def _iterate(
        self, start: bytes | None, keys_only: bool, reverse: bool = False
    ) -> Iterator[Any]:
        try:
            if self.backend == "lmdb":
                cursor = self.handle.txn().cursor()
                if reverse:
                    found = cursor.last()
                elif start is None:
                    found = cursor.first()
                else:
                    found = cursor.set_range(start)
                if not found:
                    return
                step = cursor.iterprev if reverse else cursor.iternext
                yield from step(keys=True, values=not keys_only)
            else:
                # Checksums verified: without, a damaged block whose bytes still decode
                # (no compression, or damage snappy misses) is read as if it were data.
                # plyvel's iterator then just stops at the damage (it does not check the
                # iterator's status): an end before the database's own end is that.
                last: bytes | None = None
                with self.handle.db().iterator(
                    start=start,
                    include_value=not keys_only,
                    reverse=reverse,
                    verify_checksums=True,
                ) as records:
                    for record in records:
                        last = record if keys_only else record[0]
                        yield record
                self._check_leveldb_end(start, last, reverse)
        except self._errors() as exc:
            raise self._failed(exc) from exc

    def _check_leveldb_end(self, start: bytes | None, last: bytes | None, reverse: bool) -> None:
        """Raise if a checksummed LevelDB iteration ended before the database's end."""
        db = self.handle.db()
        # The key a complete iteration ends at: forward, the last key (if at or past
        # `start`); in reverse, the first key at or past `start`.
        with db.iterator(
            start=start if reverse else None, include_value=False, reverse=not reverse
        ) as ends:
            end = next(ends, None)
        if end is not None and not reverse and start is not None and end < start:
            end = None
        if end is None or last == end:
            return
        # The key after the last one read, found without checksums, read with them.
        with db.iterator(
            start=None if reverse else last,
            stop=last if reverse else None,
            include_value=False,
            include_start=last is None,
            reverse=reverse,
        ) as rest:
            following = next(rest, None)
        if following is not None:
            db.get(following, verify_checksums=True)  # raises CorruptionError, as expected

        where = "its first record" if last is None else f"key {key_text(last)}"
        raise BackendError(
            f"{self.path}: leveldb read stopped at {where}, before its last record "
            "(a damaged table file?)"
        )

    def iter_keys(self) -> Iterator[bytes]:
        """The keys in order, without reading the values."""
        return self._iterate(None, keys_only=True)

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        try:
            if self.backend == "lmdb":
                value = self.handle.txn().get(key)
            else:
                value = self.handle.db().get(key, verify_checksums=True)
        except self._errors() as exc:
            raise self._failed(exc) from exc
        return None if value is None else bytes(value)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self._iterate(None, keys_only=False)

    def iter_from(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` in key order from the first key at or after ``start``."""
        return self._iterate(start, keys_only=False)

    def last_key(self) -> bytes | None:
        """The greatest key, or None for an empty database."""
        for key in self._iterate(None, keys_only=True, reverse=True):
            return bytes(key)
        return None

    def first_key(self) -> bytes | None:
        """The smallest key, or None for an empty database."""
        for key in self._iterate(None, keys_only=True):
            return bytes(key)
        return None

    def close(self) -> None:
        """Release this reader's share of the handle (closed when the last share goes)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _release(handle)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> DbReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_reader(path: str | os.PathLike[str], backend: str | None = None) -> DbReader:
    """Open a finished LMDB or LevelDB database for reading (backend detected when None).

    Raises:
        BackendError: the path is not a database, or the backend cannot open it.
    """
    return DbReader(path, backend)


def iter_db(
    path: str | os.PathLike[str], backend: str | None = None
) -> Iterator[tuple[bytes, Any]]:
    """Iterate a finished database as ``(key, caffe.Datum)`` in key order, for either backend.

    Raises:
        BackendError: the path is not a database of either backend.
        DatumError: a value is not a Datum (the database and the key named).
    """
    with open_reader(path, backend) as reader:
        for key, value in reader:
            try:
                datum = decode_datum(value)
            except DatumError as exc:
                raise DatumError(f"{os.fspath(path)}: key {key_text(key)}: {exc}") from None
            yield bytes(key), datum


def probe_database(backend: str, path: str) -> str | None:
    """Open the database at ``path`` read-only as ``backend``; None if it opens, else why not.

    Through this process's handle table, so a database the process is reading (``open_db``)
    probes as itself rather than as "already open in this process". Nothing is created:
    LMDB is opened without its lock file, LevelDB with ``create_if_missing=False``.
    """
    try:
        with DbReader(path, backend) as reader:
            reader.first_key()
    except BackendError as exc:
        cause = exc.__cause__
        return backend_message(cause) if cause is not None else str(exc)
    return None


@contextlib.contextmanager
def shared_reader(path: str | os.PathLike[str], backend: str | None = None) -> Iterator[DbReader]:
    """A reader of the database at ``path``, closed on exit (what info, verify and export read through)."""
    with DbReader(path, backend) as reader:
        yield reader
