"""Readers of finished LMDB and LevelDB databases: one handle per database per process,
correct under fork, spawn, forkserver and threads, and under ``close()`` from any thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mnist2db.errors import BackendError, DatumError, Mnist2dbError, backend_message
from mnist2db.formats.datum.message import check_datum, decode_datum, key_text
from mnist2db.storage.databases.backends import check_backend, detect_backend, file_kind
from mnist2db.storage.databases.handles import ReadHandle, handle_class

# -- the design, written once ------------------------------------------------------------------
#
# * One handle per database per process (storage/databases/handles.py has one class per backend, named
#   by its entry in storage/backends.BACKEND), shared by every reader open on it (open_db, open_reader,
#   iter_db, info, verify, export, show): py-lmdb refuses a second environment on the same
#   files in one process, and LevelDB a second open. The table below is guarded by a lock,
#   so threads opening one database at once share one handle.
# * One version: a handle opens the database's *directory* first and keeps that descriptor;
#   the backend and mnist2db.json are opened through it (/proc/self/fd/N), so a database
#   replaced under the same name while it is being opened or read (convert --overwrite
#   swaps directories) is never read half old, half new. A reader can check that its path
#   still names the directory it opened (check_current): readers of mnist2db.json do,
#   after reading it, so its options and the records are one version or an error.
# * Closing while another thread reads: every read holds a pin on the handle (a count in
#   the table, under its lock) for as long as it uses the handle, an iteration for its
#   whole life; the backend is closed only when no reader and no pin is left. close() never
#   waits and never pulls a handle from under a read: the read finishes, and the next use
#   of a closed dataset opens the handle again. LMDB's hot path (dataset[i]) takes no pin:
#   LMDB's environment is never closed explicitly (outside a forked child) but dropped,
#   and each transaction keeps its environment alive, so it ends when its last transaction
#   does (see backend_handles.LmdbHandle).
# * fork(): LMDB's rule is that an environment is never used across fork. In the child,
#   every inherited LMDB environment is closed (harmless with lock=False: there are no
#   reader slots to clear) and reopened on first use. A LevelDB handle cannot be shared by
#   two processes and LevelDB admits one process at a time, so a forked child does not read
#   through it: its first read raises BackendError saying what to do. The inherited handle
#   is never closed nor freed in the child (closing waits for LevelDB's background thread,
#   which does not exist after fork).
# * spawn/forkserver: a pickled dataset carries no handle and opens its own in the worker,
#   checking that the path still names the database it was made from.

#: (real path, backend, st_dev, st_ino of the directory) -> the process's handle on it.
_HANDLES: dict[tuple[str, str, int, int], ReadHandle] = {}
# Re-entrant: a dataset freed by the garbage collector while this thread holds the lock
# (inside _acquire) releases its handle from within.
_HANDLES_LOCK = threading.RLock()

#: Directory identity: (st_dev, st_ino).
Identity = tuple[int, int]


def _after_fork_in_child() -> None:
    global _HANDLES_LOCK
    _HANDLES_LOCK = threading.RLock()  # another thread may have held it at fork time
    parent = os.getppid()
    for handle in _HANDLES.values():
        handle.after_fork_in_child(parent)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _open_directory(path: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags)
    except NotADirectoryError:
        raise BackendError(f"{path}: not a database directory (LMDB or LevelDB)") from None
    except FileNotFoundError:
        raise BackendError(f"{path}: no such database") from None
    except OSError as exc:
        raise BackendError(f"{path}: cannot open database: {exc.strerror or exc}") from None


def _replaced(path: str) -> BackendError:
    return BackendError(
        f"{path}: the database was replaced while it was being read (convert --overwrite?); "
        "open it again"
    )


def _prune() -> None:
    """Forget handles no reader uses whose backend is gone (an LMDB environment that
    outlived its last reader in a transaction of another thread)."""
    for key, handle in _table():
        if handle.refs == 0 and handle.forked_from is None and not handle.alive():
            if _HANDLES.get(key) is handle:
                del _HANDLES[key]
            handle.forget()


def _table() -> list[tuple[tuple[str, str, int, int], ReadHandle]]:
    """A copy of the handle table. The lock is re-entrant, so a reader's ``__del__`` run by
    the garbage collector in this very thread may change the table while it is copied
    ("dictionary changed size during iteration", seen under load): copy again."""
    while True:
        try:
            return list(_HANDLES.items())
        except RuntimeError:
            continue


def _acquire(path: str, backend: str, identity: Identity | None) -> ReadHandle:
    """The process's handle on the database at ``path``, opened, with one more reference.

    ``identity``: the directory the caller opened before (a dataset used again after
    close(), or unpickled in a worker); another directory at ``path`` is an error.
    """
    fd = _open_directory(path)
    try:
        status = os.fstat(fd)
        found = (status.st_dev, status.st_ino)
        if identity is not None and found != identity:
            raise _replaced(path)
        key = (os.path.realpath(path), backend, *found)
        with _HANDLES_LOCK:
            _prune()
            handle = _HANDLES.get(key)
            if handle is None:
                handle = _HANDLES[key] = handle_class(backend)(path, fd, found)
                fd = -1  # the handle owns it now
            handle.refs += 1
            try:
                handle.ensure_open()
            except BaseException:
                _unpin(handle)
                raise
    finally:
        if fd >= 0:
            os.close(fd)
    return handle


def _unpin(handle: ReadHandle) -> None:
    """Drop one reference (a reader's share, or one read's pin); the last one closes."""
    with _HANDLES_LOCK:
        handle.refs -= 1
        if handle.refs > 0 or handle.forked_from is not None:
            # A LevelDB handle inherited by fork stays in the table: opening the database
            # again in this process would fail on the lock the parent holds, without a hint.
            return
        handle.release()
        if not handle.alive():
            for key, found in _table():
                if found is handle and _HANDLES.get(key) is handle:
                    del _HANDLES[key]
            handle.forget()


def _pin(handle: ReadHandle) -> ReadHandle:
    with _HANDLES_LOCK:
        handle.refs += 1
    return handle


def _read_regular_file(dir_fd: int, name: str, failed: str, limit: int) -> bytes | None:
    """The bytes of ``name`` in the directory ``dir_fd``, or None if there is none.

    Only a regular file is read, opened non-blocking (a FIFO or a device named so is
    refused, never waited on or read without end), and at most ``limit`` bytes of it.

    Raises:
        Mnist2dbError: it is not a regular file, is larger than ``limit``, or cannot be read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Mnist2dbError(f"{failed}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Mnist2dbError(f"{failed}: not a regular file ({file_kind(mode)})")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, limit + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Mnist2dbError(f"{failed}: larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise Mnist2dbError(f"{failed}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class DbReader:
    """A finished database opened read-only: ``len()``, ``get(key)``, and iteration in key order.

    Readers of one database in one process share one handle (see the notes above), so any
    number may be open at once, in any thread; each :meth:`close` releases its share, and a
    read in progress in another thread finishes on the handle it started with.

    ``identity``: the ``(st_dev, st_ino)`` of the directory this reader must find at
    ``path`` (None: whatever is there).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | bytes,
        backend: str | None = None,
        *,
        identity: Identity | None = None,
    ) -> None:
        self.path = os.fsdecode(path)
        self.backend = backend or detect_backend(self.path)
        check_backend(self.backend)
        self._handle: ReadHandle | None = _acquire(self.path, self.backend, identity)
        #: The ``(st_dev, st_ino)`` of the database directory this reader reads.
        self.identity: Identity = self._handle.identity

    @property
    def handle(self) -> ReadHandle:
        """The process's handle this reader shares (for a dataset's hot path)."""
        handle = self._handle
        if handle is None:
            raise BackendError(f"{self.path}: the reader is closed")
        return handle

    # -- pins ------------------------------------------------------------------------------

    def pin(self) -> ReadHandle | None:
        """The handle with a pin held for one read (release with :meth:`unpin`), or None if
        this reader is closed."""
        with _HANDLES_LOCK:
            handle = self._handle
            if handle is None:
                return None
            handle.refs += 1
            return handle

    @staticmethod
    def unpin(handle: ReadHandle) -> None:
        """Release a pin taken by :meth:`pin`."""
        _unpin(handle)

    def _pinned(self) -> ReadHandle:
        handle = self.pin()
        if handle is None:
            raise BackendError(f"{self.path}: the reader is closed")
        return handle

    @contextlib.contextmanager
    def _using(self) -> Iterator[ReadHandle]:
        handle = self._pinned()
        try:
            yield handle
        finally:
            _unpin(handle)

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._using() as handle:
            return handle.count()

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        with self._using() as handle:
            return handle.get(key)

    def iter_keys(self) -> Iterator[bytes]:
        """The keys in order, without reading the values."""
        return iterate(self._pinned, None, keys_only=True)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return iterate(self._pinned, None, keys_only=False)

    def iter_from(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` in key order from the first key at or after ``start``."""
        return iterate(self._pinned, start, keys_only=False)

    def iter_views(self, start: bytes | None = None) -> Iterator[tuple[bytes, Any]]:
        """Iterate ``(key, value)`` in key order (from the first key at or after ``start``)
        without copying the values where the backend allows: an LMDB value is a read-only
        ``memoryview`` into the database's map, valid only while this reader is open (a
        LevelDB value is ``bytes``, as :meth:`__iter__` gives). For a consumer that writes
        or hashes values as they are (``export``), never one that keeps them."""
        return iterate(self._pinned, start, keys_only=False, views=True)

    def last_key(self) -> bytes | None:
        """The greatest key, or None for an empty database."""
        for key in iterate(self._pinned, None, keys_only=True, reverse=True):
            return bytes(key)
        return None

    def first_key(self) -> bytes | None:
        """The smallest key, or None for an empty database."""
        for key in iterate(self._pinned, None, keys_only=True):
            return bytes(key)
        return None

    # -- the directory's other files -----------------------------------------------------------

    def read_file(self, name: str, limit: int, what: str) -> bytes | None:
        """The bytes of the file ``name`` in this database's directory (the directory this
        reader opened, whatever its path names now), or None if there is none.

        Raises:
            Mnist2dbError: it is not a regular file, is larger than ``limit`` bytes, or
                cannot be read: ``PATH: cannot read WHAT: why``.
        """
        with self._using() as handle:
            shown = os.path.join(self.path, name)
            return _read_regular_file(handle.dir_fd, name, f"{shown}: cannot read {what}", limit)

    def check_current(self) -> None:
        """Check that ``path`` still names the directory this reader reads.

        Raises:
            BackendError: the database was replaced (or removed) since it was opened.
        """
        try:
            status = os.stat(self.path)
        except OSError:
            raise _replaced(self.path) from None
        if (status.st_dev, status.st_ino) != self.identity:
            raise _replaced(self.path)

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release this reader's share of the handle (closed when the last share goes)."""
        with _HANDLES_LOCK:
            handle, self._handle = self._handle, None
        if handle is not None:
            _unpin(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> DbReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def iterate(
    pinned: Callable[[], ReadHandle],
    start: bytes | None,
    *,
    keys_only: bool,
    reverse: bool = False,
    views: bool = False,
) -> Iterator[Any]:
    """Records in key order (``(key, value)``, or keys) through the handle ``pinned()``
    returns with a pin, held until the iteration ends or is dropped (``views``:
    :meth:`DbReader.iter_views`)."""
    handle = pinned()
    try:
        yield from handle.iterate(start, keys_only, reverse, views)
    finally:
        _unpin(handle)


def open_reader(path: str | os.PathLike[str] | bytes, backend: str | None = None) -> DbReader:
    """Open a finished LMDB or LevelDB database for reading (backend detected when None).

    Raises:
        BackendError: the path is not a database, or the backend cannot open it.
    """
    return DbReader(path, backend)


def iter_db(
    path: str | os.PathLike[str] | bytes, backend: str | None = None
) -> Iterator[tuple[bytes, Any]]:
    """Iterate a finished database as ``(key, caffe.Datum)`` in key order, for either backend.

    Each Datum is checked as every reader checks it (:func:`mnist2db.datum.check_datum`):
    shape, data length, and an encoded image's header.

    Raises:
        BackendError: the path is not a database of either backend.
        DatumError: a value is not a usable Datum (the database and the key named).
    """
    with open_reader(path, backend) as reader:
        for key, value in reader:
            where = f"{reader.path}: key {key_text(bytes(key))}"
            try:
                datum = decode_datum(value)
                check_datum(datum, where)
            except DatumError as exc:
                raise DatumError(_prefixed(where, exc)) from None
            yield bytes(key), datum


def _prefixed(where: str, exc: Exception) -> str:
    """``exc``'s message naming ``where`` once."""
    text = str(exc)
    return text if text.startswith(where) else f"{where}: {text}"


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
        if cause is None:
            return str(exc)

        # Opened through the directory's descriptor: named by the path, as the user gave it.
        return re.sub(r"/proc/self/fd/[0-9]+", lambda _: path, backend_message(cause))
    return None


@contextlib.contextmanager
def shared_reader(
    path: str | os.PathLike[str] | bytes, backend: str | None = None
) -> Iterator[DbReader]:
    """A reader of the database at ``path``, closed on exit (what info, verify and export read through)."""
    with DbReader(path, backend) as reader:
        yield reader
