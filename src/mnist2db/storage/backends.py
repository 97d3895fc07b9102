"""LMDB and LevelDB behind one small interface: writers that take key/value batches, readers
that iterate ``(key, value)`` in key order.

Writers are opened on a fresh directory (the staging directory of :mod:`mnist2db.conversion`)
and do not fsync per batch: the finished database is flushed once, by :meth:`Writer.close`,
before it is moved to its final name. Caffe's own options are kept (LMDB: a directory with
``data.mdb`` and ``lock.mdb``; LevelDB: 64 KiB blocks, 100 open files), but for LevelDB's
write buffer, sized to bound memory (:func:`leveldb_write_buffer`).
"""

from __future__ import annotations

import itertools
import os
import stat
from collections import deque
from collections.abc import Iterator, Sequence

from mnist2db.errors import ArgumentError, BackendError
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, Protocol, named_tuple

if TYPE_CHECKING:
    from typing import Any

#: The databases mnist2db writes and reads, the default first (:data:`BACKEND` holds what
#: it knows of each).
BACKENDS = ("lmdb", "leveldb")
#: The backend every writer uses unless told (Caffe's convert_mnist_data: ``--backend=lmdb``).
DEFAULT_BACKEND = BACKENDS[0]
#: The backend of siamese pair databases unless told: Caffe's convert_mnist_siamese_data
#: writes LevelDB only, and its example's net reads LevelDB.
SIAMESE_BACKEND = "leveldb"
#: Records per transaction (LMDB) or write batch (LevelDB), as Caffe's convert_mnist_data commits.
DEFAULT_BATCH_SIZE = 1000

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


def _drain(iterator: Iterator[object]) -> None:
    deque(iterator, maxlen=0)


class Writer(Protocol):
    """Receives records in increasing key order, one batch per transaction."""

    def write_batch(self, items: Sequence[tuple[bytes, bytes]]) -> None: ...

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
        self._writeback = _Writeback(path, "data.mdb")

    def write_batch(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self._write(items)
        if items:
            self._writeback.wrote(len(items) * (len(items[0][0]) + len(items[0][1]) + 16))

    def _write(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        lmdb = self._lmdb
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    consumed, added = txn.cursor().putmulti(items, append=self._append)
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
    """Starts the kernel writing the database's dirty pages to disk every few MiB, unwaited.

    The writers do not sync per batch, so without this all the data waits for the final
    fsync, which then takes as long as the disk needs for the whole database. Started
    early, that writing overlaps the conversion and the final fsync (still the one that
    makes the database durable) has little left to do. Linux only (sync_file_range);
    elsewhere, and on any failure, this does nothing.

    Args:
        directory: the database directory.
        suffix: which of its files to write back (``data.mdb``; ``.log`` for LevelDB).
    """

    EVERY = 4 << 20
    _SYNC_FILE_RANGE_WRITE = 2

    def __init__(self, directory: str, suffix: str) -> None:
        self._directory = directory
        self._suffix = suffix
        self._pending = 0
        self._fds: dict[str, int] = {}
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
        for fd in self._fds.values():
            if self._func(fd, 0, 0, self._SYNC_FILE_RANGE_WRITE) != 0:
                self.close()  # not supported here: stop trying
                return

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

    def write_batch(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        try:
            with self._db.write_batch() as batch:
                # starmap drained by a zero-length deque: the loop runs in C.
                _drain(itertools.starmap(batch.put, items))
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


def check_backend(backend: str) -> None:
    """Raises BackendError unless ``backend`` is one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def check_batch_size(batch_size: int) -> None:
    """Raises Mnist2dbError unless a writer's ``batch_size`` is at least 1."""
    if batch_size < 1:
        raise ArgumentError(f"batch size must be at least 1, got {batch_size}")


#: The most bytes of records (keys and values) one batch may hold: a batch is encoded whole,
#: then written as one transaction (LMDB: dirty pages in memory until the commit) or one
#: WriteBatch (LevelDB: a copy of every record, then the memtable takes it whole), so
#: memory grows with it, about 5x (LMDB) and 7x (LevelDB) the records' bytes: measured with
#: /usr/bin/time -v on 1,000,000 28 x 28 records, a batch of 1,000 peaks at 135 MiB (LMDB)
#: and 57 MiB (LevelDB), 83,468 (64 MiB of records) at 426 and 533 MiB, 100,000 at 507 and
#: 631 MiB, 1,000,000 (the whole set) at 2.4 and 3.5 GiB. 64 MiB of records, as the batches
#: of mnist.mean and convert_imageset (their BATCH_BYTES), keeps a conversion under about
#: 600 MiB: a batch stops at ``batch_size`` records or at this many bytes
#: (:func:`batch_records`). Caffe commits every 1000 records: records up to 67 KB (a
#: 259 x 259 image) keep that; larger ones are committed fewer at a time (the records, and
#: so the database's contents, are the same at any batch size).
BATCH_BYTES_LIMIT = 64 << 20


def batch_full(count: int, nbytes: int, batch_size: int) -> bool:
    """True once a batch being gathered of ``count`` items and ``nbytes`` bytes is full: at
    ``batch_size`` items or :data:`BATCH_BYTES_LIMIT` bytes (for items whose size is known
    only one at a time: the mean's pixels, convert_imageset's records)."""
    return count >= batch_size or nbytes >= BATCH_BYTES_LIMIT


def batch_records(batch_size: int, value_size: int) -> int:
    """The records one batch (one transaction) holds: ``batch_size``, or fewer when that
    many ``value_size``-byte values under Caffe's 8-byte keys would take more than
    :data:`BATCH_BYTES_LIMIT`; at least one, whatever its size."""
    return max(1, min(batch_size, BATCH_BYTES_LIMIT // (value_size + 8)))


def size_hint(records: int, value_size: int, *, streaming: bool = False) -> int:
    """The ``size_hint`` of :func:`open_writer` for ``records`` values of ``value_size`` bytes
    under Caffe's 8-byte keys: LMDB's pages hold small records side by side and give large
    ones whole overflow pages; twice that for the B-tree's slack, plus 16 MiB.

    ``streaming``: the count comes from a pipe's header, not checked against its size before
    the data arrives: reserve at most 1 GiB of what it merely promises (the map grows when
    needed).
    """
    record = value_size + 8 + 16
    page = 4096
    if record > page // 2:
        record = -(-record // page) * page
    hint = 2 * records * record + (16 << 20)
    return min(hint, 1 << 30) if streaming else hint


@named_tuple
class Backend(NamedTuple):
    """What mnist2db knows of one backend, in one place (:data:`BACKEND`): its ``name``,
    the ``marker`` file that tells its databases apart (:func:`detect_backend`), the
    ``files`` it creates (a regular expression for whole names: what ``--overwrite`` may
    remove), how messages name its databases (``article``: "an LMDB"), the longest key it
    stores (``key_limit``; None: no limit below Caffe's), its ``writer``, and its
    ``read_handle``: the name of its read-handle class in
    :mod:`mnist2db.storage.backend_handles` (resolved there, by
    :func:`~mnist2db.storage.backend_handles.handle_class`: that module loads the backend
    libraries, which a plain conversion's start-up never pays for)."""

    name: str
    marker: str
    files: str
    article: str
    key_limit: int | None
    writer: Any
    read_handle: str

    def open_writer(
        self, path: str, size_hint: int = 0, append: bool = True, existing: bool = False
    ) -> Writer:
        """A new, empty database in the directory ``path`` (see :func:`open_writer`)."""
        writer: Writer = self.writer(path, size_hint, append=append, existing=existing)
        return writer


#: Every backend, by name (the order of :data:`BACKENDS`). LevelDB numbers its tables,
#: logs and manifests (``000005.ldb``, ``000003.log``, ``MANIFEST-000002``), so a user's
#: ``notes.log`` is not one of its files. Anything else in a directory means it is not
#: (only) a database. LMDB's largest key is ``mdb_env_get_maxkeysize``, 511 bytes in its
#: default build.
#: LMDB's largest key (``mdb_env_get_maxkeysize``, 511 bytes in its default build).
LMDB_KEY_LIMIT = 511

BACKEND: dict[str, Backend] = {
    "lmdb": Backend(
        "lmdb",
        "data.mdb",
        r"data\.mdb|lock\.mdb",
        "an LMDB",
        LMDB_KEY_LIMIT,
        LmdbWriter,
        "LmdbHandle",
    ),
    "leveldb": Backend(
        "leveldb",
        "CURRENT",
        r"CURRENT|LOCK|LOG|LOG\.old|MANIFEST-[0-9]+|[0-9]+\.(?:log|ldb|sst)",
        "a LevelDB",
        None,
        LeveldbWriter,
        "LeveldbHandle",
    ),
}


def backend_named(backend: str) -> Backend:
    """The :class:`Backend` called ``backend``.

    Raises:
        ArgumentError: no backend has that name.
    """
    found = BACKEND.get(backend)
    if found is None:
        check_backend(backend)
    return BACKEND[backend]


def open_writer(
    backend: str, path: str, size_hint: int = 0, append: bool = True, existing: bool = False
) -> Writer:
    """Create a new, empty database of ``backend`` in the directory ``path`` (``existing``:
    continue the one there, a resumed conversion's).

    Args:
        backend: ``"lmdb"`` or ``"leveldb"``.
        path: a directory to create the database in (LMDB) or at (LevelDB).
        size_hint: expected bytes of keys and values, used to size LMDB's map.
        append: keys arrive in strictly increasing order (lets LMDB append).

    Raises:
        BackendError: unknown backend, or the backend could not create the database.
    """
    return backend_named(backend).open_writer(path, size_hint, append, existing)


def detect_backend(path: str | os.PathLike[str] | bytes) -> str:
    """Tell which backend wrote the database at ``path``, from its files.

    Raises:
        BackendError: the path is missing, or is neither an LMDB nor a LevelDB database.
    """
    path = os.fsdecode(path)
    if not os.path.exists(path):
        raise BackendError(f"{path}: no such database")
    if not os.path.isdir(path):
        raise BackendError(f"{path}: not a database directory (LMDB or LevelDB)")
    for backend in BACKEND.values():
        name = backend.marker
        try:
            mode = os.stat(os.path.join(path, name)).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise BackendError(
                f"{os.path.join(path, name)}: not a regular file ({file_kind(mode)}); "
                f"not {backend.article} database"
            )
        return backend.name
    raise BackendError(f"{path}: neither an LMDB (no data.mdb) nor a LevelDB (no CURRENT) database")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words (from its ``st_mode``)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


#: The files each backend creates in its directory (:attr:`Backend.files`), by name.
DATABASE_FILES: dict[str, str] = {name: backend.files for name, backend in BACKEND.items()}


def is_database_file(backend: str, name: str) -> bool:
    """True if ``name`` is a file name ``backend`` creates in a database directory."""
    import re

    return re.fullmatch(DATABASE_FILES[backend], name, re.ASCII) is not None


def backend_message(exc: BaseException) -> str:
    """A backend's message as text (plyvel gives ``b'...'`` bytes), on one line."""
    arg = exc.args[0] if exc.args else exc
    text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
    return " ".join(text.split())
