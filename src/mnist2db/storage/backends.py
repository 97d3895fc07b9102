"""LMDB and LevelDB: what mnist2db knows of each, in one place (:class:`Backend`, the
:data:`BACKEND` table: names, marker file, files, article, key limit, writer, read handle),
chosen once by name; the defaults, the batch bounds, and telling which backend wrote a
database. The writers are :mod:`mnist2db.storage.writers`; the read handles
:mod:`mnist2db.storage.backend_handles`.
"""

from __future__ import annotations

import os
import stat

from mnist2db.errors import ArgumentError, BackendError
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.storage.writers import LeveldbWriter, LmdbWriter, Writer

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


#: LMDB's largest key (``mdb_env_get_maxkeysize``, 511 bytes in its default build).
LMDB_KEY_LIMIT = 511

#: Every backend, by name (the order of :data:`BACKENDS`). LevelDB numbers its tables,
#: logs and manifests (``000005.ldb``, ``000003.log``, ``MANIFEST-000002``), so a user's
#: ``notes.log`` is not one of its files. Anything else in a directory means it is not
#: (only) a database. LMDB's largest key is ``mdb_env_get_maxkeysize``, 511 bytes in its
#: default build.
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
