"""The backends' read handles: one small class per backend, chosen once, by the backend's
entry in :data:`mnist2db.storage.databases.backends.BACKEND` (:func:`handle_class`), as its writer is.

A handle is one open database in this process; :mod:`mnist2db.storage.databases.readers` shares it between
readers, counts who uses it (readers and reads in progress) and tells it when the last one
is gone. A handle is opened through a descriptor of the database's directory, so it reads
the directory it was opened on even when the path is given to another one meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar

import lmdb
import plyvel

from mnist2db.errors import BackendError, backend_message
from mnist2db.formats.datum.message import key_text
from mnist2db.storage.databases.backends import backend_named, file_kind, is_database_file
from mnist2db.storage.databases.checks import (
    check_leveldb_current,
    check_leveldb_logs,
    check_lmdb_file,
    leveldb_lock_holder,
)

#: py-lmdb's options for reading a finished database. lock=False: a finished database never
#: changes, so readers need no reader table; nothing is written to lock.mdb (read-only media
#: work as any other), a killed worker leaves no stale reader slot, and max_readers does not
#: apply. readahead=False: random access to a database larger than the page cache then
#: reads only the pages it needs.
#: subdir=False, the data file named: py-lmdb (3.0) refuses an environment "already open in
#: this process" when its data file *or its lock file* has the inode of one still open; a
#: reader never opens lock.mdb (lock=False), so a deleted database's lock.mdb inode may be
#: reused by a new database's while a dataset still holds the old one, and every open of the
#: new one would be refused. Named by its data file alone (held open, so never reused),
#: an environment is refused only when it truly is open.
LMDB_READ_OPTIONS: dict[str, Any] = {
    "readonly": True,
    "lock": False,
    "readahead": False,
    "subdir": False,
    "max_dbs": 0,
}

#: plyvel's options for reading a finished database: never create one, and refuse damage
#: LevelDB's recovery would otherwise skip (see LeveldbHandle.ensure_open).
LEVELDB_READ_OPTIONS: dict[str, Any] = {"create_if_missing": False, "paranoid_checks": True}

_LEVELDB_HINT = (
    "LevelDB admits one process at a time: read it with num_workers=0 (in the process "
    "that opened it), or convert it to LMDB (mnist2db convert --backend lmdb), which any "
    "number of processes can read"
)

_PROC_FD: bool | None = None
#: Milliseconds an LMDB open waits for a dropped environment of the same files to end.
_ENDING_WAITS = 2000


def _proc_fd() -> bool:
    """True where a directory descriptor can be opened as a path (/proc/self/fd/N)."""
    global _PROC_FD
    if _PROC_FD is None:
        _PROC_FD = os.path.isdir("/proc/self/fd")
    return _PROC_FD


def held_elsewhere(reason: str) -> bool:
    """True if LevelDB's ``reason`` for not opening is another process holding its lock."""
    return "lock" in reason.lower() and "temporarily unavailable" in reason.lower()


class ReadHandle:
    """One open database in this process, read-only.

    ``refs`` (readers sharing it, and reads in progress) is kept by :mod:`mnist2db.storage.databases.readers`
    under its table lock; :meth:`ensure_open` and :meth:`release` are called there too.
    """

    backend: ClassVar[str] = ""
    #: True where :meth:`lookup` is a hot path that needs no pin (LMDB's).
    has_lookup: ClassVar[bool] = False

    def __init__(self, path: str, dir_fd: int, identity: tuple[int, int]) -> None:
        self.path = path
        self.dir_fd = dir_fd
        #: ``(st_dev, st_ino)`` of the database directory.
        self.identity = identity
        self.refs = 0
        self.forked_from: int | None = None  # LevelDB: the pid that opened it, in a child
        self._open_lock = threading.Lock()

    @property
    def location(self) -> str:
        """The path the backend is opened at: the directory's descriptor where possible."""
        return f"/proc/self/fd/{self.dir_fd}" if _proc_fd() else self.path

    def message(self, exc: BaseException) -> str:
        """The backend's message for ``exc``, naming the database by the user's path."""
        return backend_message(exc).replace(self.location, self.path)

    def failed(self, exc: BaseException) -> BackendError:
        return BackendError(f"{self.path}: {self.backend} read failed: {self.message(exc)}")

    def opens(self, name: str) -> bool:
        """True for the names of the files the backend opens to read."""
        return is_database_file(self.backend, name)

    def check_files(self) -> None:
        """Refuse a database whose backend files are not all regular files: the backend
        would block opening a FIFO for ever, or read a device without end."""
        try:
            entries = list(os.scandir(self.dir_fd))
        except OSError:
            return  # the backend's own open says what is wrong
        for entry in entries:
            if not self.opens(entry.name):
                continue
            try:
                mode = os.stat(entry.name, dir_fd=self.dir_fd).st_mode
            except OSError:
                continue  # a dangling link: the backend's own open says so
            if not stat.S_ISREG(mode):
                raise BackendError(
                    f"{os.path.join(self.path, entry.name)}: not a regular file "
                    f"({file_kind(mode)}); the {self.backend} database cannot be read"
                )

    def check_path_after_open(self) -> None:
        """Opened by path (no /proc): the path must still name the directory."""
        if self.location != self.path:
            return
        status = os.stat(self.path)
        if (status.st_dev, status.st_ino) != self.identity:
            self.release()
            raise BackendError(
                f"{self.path}: the database was replaced while it was being opened; open it again"
            )

    # -- what each backend provides --------------------------------------------------------

    @classmethod
    def errors(cls) -> tuple[type[Exception], ...]:
        """The backend library's exception classes."""
        raise NotImplementedError

    def ensure_open(self) -> None:
        """Open the backend if it is not open (under the table lock)."""
        raise NotImplementedError

    def release(self) -> None:
        """No reader and no read is left: let the backend go."""
        raise NotImplementedError

    def alive(self) -> bool:
        """True while the backend is open (or still in use by a read that took no pin)."""
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def lookup(self, key: bytes) -> Any:
        """The hot path of ``dataset[i]`` (where :attr:`has_lookup`): the value under
        ``key`` as the backend gives it, None when there is none; AttributeError when
        this thread cannot read without opening first (then :meth:`get` opens)."""
        raise AttributeError("lookup")

    def iterate(
        self, start: bytes | None, keys_only: bool, reverse: bool, views: bool = False
    ) -> Iterator[Any]:
        """Keys or ``(key, value)`` from ``start`` (``views``: values may be read-only views
        into the backend's memory, valid while the handle is open)."""
        raise NotImplementedError

    def after_fork_in_child(self, parent: int) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """The handle leaves the table: close the directory's descriptor."""
        fd, self.dir_fd = self.dir_fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class LmdbHandle(ReadHandle):
    """An LMDB environment; each thread reads through one long-lived read transaction of
    its own (LMDB transactions belong to one thread; with no writer, a long one costs
    nothing), kept in :attr:`local` (``local.txn``); :meth:`lookup` reads through it.

    The environment is never closed explicitly while threads may use it: py-lmdb reads
    with the GIL released, so closing under a read would unmap the pages it reads.
    :meth:`release` drops the environment and every thread's transaction instead; each
    transaction holds its environment, so the environment ends when the last transaction
    in use does. Until then it is taken up again by the next reader (:meth:`ensure_open`):
    py-lmdb refuses a second environment on the same files in one process.
    """

    backend = "lmdb"
    has_lookup = True

    def __init__(self, path: str, dir_fd: int, identity: tuple[int, int]) -> None:
        super().__init__(path, dir_fd, identity)
        self._env: Any = None
        self._env_ref: Any = None  # weakref.ref to the environment last opened
        self.local = threading.local()

    @classmethod
    def errors(cls) -> tuple[type[Exception], ...]:
        return (lmdb.Error,)

    def opens(self, name: str) -> bool:
        return name == "data.mdb"  # lock=False: lock.mdb is never opened

    def ensure_open(self) -> None:
        if self._env is not None:
            return
        env = self._env_ref() if self._env_ref is not None else None
        if env is None:
            self.check_files()
            check_lmdb_file(self.path, self.dir_fd)
            env = self._open_env()
        self._env, self._env_ref = env, weakref.ref(env)
        self.check_path_after_open()

    def _open_env(self) -> Any:
        # The environment last dropped may be ending in another thread this moment (its
        # weak reference already cleared, py-lmdb's record of it not yet): wait for it.
        waited = 0
        while True:
            try:
                return lmdb.open(
                    os.fsencode(os.path.join(self.location, "data.mdb")), **LMDB_READ_OPTIONS
                )
            except lmdb.Error as exc:
                if "already open in this process" not in str(exc) or waited == _ENDING_WAITS:
                    raise BackendError(
                        f"{self.path}: cannot open LMDB database: {self.message(exc)}"
                    ) from exc
            waited += 1
            time.sleep(0.001)

    def release(self) -> None:
        self._env = None
        self.local = threading.local()  # every thread's transaction dropped with it

    def alive(self) -> bool:
        return self._env is not None or (self._env_ref is not None and self._env_ref() is not None)

    def after_fork_in_child(self, parent: int) -> None:
        # The same local object (datasets hold it), emptied: after fork only this thread is
        # left, and its transaction belongs to the parent's environment.
        with contextlib.suppress(AttributeError):
            del self.local.txn
        self._open_lock = threading.Lock()
        env, self._env, self._env_ref = self._env, None, None
        if env is not None:
            with contextlib.suppress(Exception):
                env.close()  # one thread: nothing else can be reading it

    def txn(self) -> Any:
        """This thread's read transaction."""
        try:
            return self.local.txn
        except AttributeError:
            pass

        txn = self.local.txn = self._begin(buffers=False)
        return txn

    def _begin(self, buffers: bool) -> Any:
        """A read transaction (``buffers``: its values are views into the map, which stays
        while the environment does: while this handle is open)."""
        with self._open_lock:
            if self._env is None:  # a forked child's first read
                self.ensure_open()
            env = self._env
        try:
            return env.begin(buffers=buffers)
        except lmdb.Error as exc:
            raise self.failed(exc) from exc

    def lookup(self, key: bytes) -> Any:
        # No pin, no bytes copy: the environment lives as long as this thread's
        # transaction, and the dataset copies the value into its array. AttributeError:
        # this thread has no transaction yet (get() begins one).
        return self.local.txn.get(key)

    def count(self) -> int:
        try:
            return int(self.txn().stat()["entries"])
        except self.errors() as exc:
            raise self.failed(exc) from exc

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self.txn().get(key)
        except self.errors() as exc:
            raise self.failed(exc) from exc
        return None if value is None else bytes(value)

    def iterate(
        self, start: bytes | None, keys_only: bool, reverse: bool, views: bool = False
    ) -> Iterator[Any]:
        try:
            # Views: a transaction of this iteration's own, its values views into the map.
            cursor = (self._begin(buffers=True) if views else self.txn()).cursor()
            if reverse:
                found = cursor.last()
            elif start is None:
                found = cursor.first()
            else:
                found = cursor.set_range(start)
            if not found:
                return
            step = cursor.iterprev if reverse else cursor.iternext
            pairs = step(keys=True, values=not keys_only)
            # Keys copied (small, kept by callers); values left in the map.
            yield from ((bytes(key), value) for key, value in pairs) if views else pairs
        except self.errors() as exc:
            raise self.failed(exc) from exc


class LeveldbHandle(ReadHandle):
    """A LevelDB database, read with block checksums verified on every path: without, a
    damaged block whose bytes still decode (no compression, or damage snappy misses) is
    read as if it were data. Closed only when no reader and no read is left: closing it
    under a read in another thread ends the process (SIGSEGV)."""

    backend = "leveldb"

    def __init__(self, path: str, dir_fd: int, identity: tuple[int, int]) -> None:
        super().__init__(path, dir_fd, identity)
        self._db: Any = None

    @classmethod
    def errors(cls) -> tuple[type[Exception], ...]:
        return (plyvel.Error,)

    def _forked(self) -> BackendError:
        return BackendError(
            f"{self.path}: this LevelDB database was opened by process "
            f"{self.forked_from} before it forked this one; {_LEVELDB_HINT}"
        )

    def ensure_open(self) -> None:
        if self._db is not None:
            return
        if self.forked_from is not None:
            raise self._forked()
        self.check_files()
        check_leveldb_current(self.path, self.dir_fd)
        check_leveldb_logs(self.path, self.dir_fd)
        if self.location != self.path and leveldb_lock_holder(self.dir_fd) == os.getpid():
            # Opened through /proc, LevelDB's own check for a lock this process holds (by
            # file name) cannot see one taken through the path: said here, in its words.
            raise BackendError(
                f"{self.path}: cannot open LevelDB database: IO error: lock "
                f"{os.path.join(self.path, 'LOCK')}: already held by process"
            )
        try:
            # LevelDB has no read-only mode: opening replays the log into a table file and
            # may compact (docs/guarantees.md says so); the records do not change. Paranoid
            # checks make a damaged log or manifest refuse the open before anything is
            # written from it: without, LevelDB skips the damaged log records (records
            # silently gone) and writes what is left into a table, deleting the log.
            self._db = plyvel.DB(os.fsencode(self.location), **LEVELDB_READ_OPTIONS)
        except plyvel.Error as exc:
            text = self.message(exc)
            hint = ""
            # EAGAIN on LOCK: another process holds the database ("already held by process"
            # cannot happen here: the table opens each database once per process).
            if held_elsewhere(text):
                # Named first: `mnist2db info` users have no DataLoader to tune.
                hint = f" (another process has it open; {_LEVELDB_HINT})"
            elif isinstance(exc, plyvel.CorruptionError):
                hint = " (a damaged LevelDB database; its files were left as they were)"
            raise BackendError(f"{self.path}: cannot open LevelDB database: {text}{hint}") from exc
        self.check_path_after_open()

    def release(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def alive(self) -> bool:
        return self._db is not None

    def after_fork_in_child(self, parent: int) -> None:
        self._open_lock = threading.Lock()
        if self._db is not None:
            _keep_forever(self._db)
        self._db = None
        self.forked_from = parent

    def db(self) -> Any:
        if self._db is None:
            if self.forked_from is not None:
                raise self._forked()
            raise BackendError(f"{self.path}: the database is closed")
        return self._db

    def count(self) -> int:
        return sum(1 for _ in self.iterate(None, True, False))

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self.db().get(key, verify_checksums=True)
        except self.errors() as exc:
            raise self.failed(exc) from exc
        return None if value is None else bytes(value)

    def iterate(
        self, start: bytes | None, keys_only: bool, reverse: bool, views: bool = False
    ) -> Iterator[Any]:
        # plyvel's checksummed iterator just stops at damage (it does not check the
        # iterator's status): an end before the database's own end is that.
        try:
            last: bytes | None = None
            with self.db().iterator(
                start=start, include_value=not keys_only, reverse=reverse, verify_checksums=True
            ) as records:
                for record in records:
                    last = record if keys_only else record[0]
                    yield record
            self._check_end(start, last, reverse)
        except self.errors() as exc:
            raise self.failed(exc) from exc

    def _check_end(self, start: bytes | None, last: bytes | None, reverse: bool) -> None:
        """Raise if a checksummed iteration ended before the database's end."""
        db = self.db()
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


def _keep_forever(obj: object) -> None:
    """Leak a reference so ``obj`` is never freed (a LevelDB handle inherited by fork)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def handle_class(backend: str) -> type[ReadHandle]:
    """The read-handle class of ``backend``, as its entry in
    :data:`~mnist2db.storage.databases.backends.BACKEND` names it.

    Raises:
        ArgumentError: no backend has that name.
    """
    found: type[ReadHandle] = globals()[backend_named(backend).read_handle]
    return found
