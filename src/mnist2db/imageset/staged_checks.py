"""What a killed run's staging directory holds, checked before ``--resume`` trusts it
(:mod:`mnist2db.imageset.resume` owns the plan): only files mnist2db makes there, none a link;
each staged database checked as every database is before its backend maps it
(:mod:`mnist2db.storage.databases.checks`), its keys Caffe's, and the one the plan made (the
identity :func:`~mnist2db.imageset.resume.recording_batches` records before each batch);
then made ready for a writer (:func:`forget_free_pages`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
from collections.abc import Callable
from typing import Any

from mnist2db.errors import BackendError, Mnist2dbError, printable
from mnist2db.imageset.resume import (
    CAFFE_KEY,
    IDENTITY_FILE,
    STAGED_RUN_FILES,
    Committed,
    StagedRun,
    committed_state,
)
from mnist2db.storage.databases.checks import (
    check_leveldb_current,
    check_leveldb_logs,
    check_lmdb_file,
)
from mnist2db.storage.destinations import is_owned_file
from mnist2db.storage.digest_state import saved_count

#: The file that says a staged directory holds a database yet (a label database is staged
#: empty until the images are all written).
_MADE = {"lmdb": "data.mdb", "leveldb": "CURRENT"}


def _lmdb_keys(path: str) -> tuple[int, bytes | None, bytes | None, str | None]:
    import lmdb

    env = lmdb.open(
        os.fsencode(os.path.join(path, "data.mdb")), readonly=True, lock=False, subdir=False
    )
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            first = cursor.key() if cursor.first() else None
            last = cursor.key() if cursor.last() else None
            value = None if last is None else hashlib.sha256(cursor.value()).hexdigest()
            return int(env.stat()["entries"]), first, last, value
    finally:
        env.close()


def _leveldb_keys(path: str) -> tuple[int, bytes | None, bytes | None, str | None]:
    import plyvel

    db = plyvel.DB(os.fsencode(path), create_if_missing=False)
    try:
        first = next(db.iterator(include_value=False), None)
        last = next(db.iterator(include_value=False, reverse=True), None)
        value = None
        # LevelDB keeps no count: the one saved with the digest's state at that last key
        # (every commit saves one), else counted key by key (a run of an earlier version).
        records = saved_count(path, last)
        if records is None:
            records = sum(1 for _ in db.iterator(include_value=False))
        if last is not None:
            value = hashlib.sha256(db.get(last) or b"").hexdigest()
        return records, first, last, value
    finally:
        db.close()


#: How each backend's committed keys are counted (its own reader, read-only).
_KEYS = {"lmdb": _lmdb_keys, "leveldb": _leveldb_keys}


def committed(path: str, backend: str) -> Committed:
    """What the staged database at ``path`` holds (its committed batches), checked as any
    database is before its backend maps it (:func:`check_staged_files`), its keys Caffe's.

    Raises:
        Mnist2dbError: one line naming the file and what is wrong (the run is kept).
    """
    check_staged_files(path, backend)
    if not os.path.lexists(os.path.join(path, _MADE[backend])):
        return Committed(0, -1, None)
    try:
        records, first, last, digest = _KEYS[backend](path)
    except Exception as exc:  # the backends' own errors: one line
        raise _staged_refusal(path, f"cannot be read: {printable(str(exc))}") from None
    for key in (first, last):
        if key is not None and CAFFE_KEY.match(key) is None:
            raise _staged_refusal(
                path, f"holds the key {printable(repr(key[:40]))}, not Caffe's %08d_PATH"
            )
    return Committed(records, -1 if last is None else int(last[:8]), first, last, digest)


def _staged_refusal(path: str, what: str) -> Mnist2dbError:
    return Mnist2dbError(
        f"{printable(path)}: --resume refused: the staged database {what}; the staged run "
        "was kept (run without --resume to start again)"
    )


def check_staged_files(path: str, backend: str) -> None:
    """Raise unless the staging directory ``path`` holds only regular files a run of
    mnist2db makes there, none linked elsewhere, and a database that passes the checks
    every database passes before its backend opens it (:mod:`mnist2db.storage.databases.checks`:
    LMDB's pages, a ``data.mdb`` cut short; LevelDB's ``CURRENT`` and logs): a link would
    send the resumed writes into another database, a cut file end the process with SIGBUS.

    Raises:
        Mnist2dbError: one line naming the file and what is wrong.
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        dir_fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _staged_refusal(path, f"cannot be opened ({exc.strerror})") from None
    try:
        names = os.listdir(dir_fd)
        for name in names:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            ours = name in STAGED_RUN_FILES or is_owned_file(backend, name)
            where = os.path.join(path, name)
            if not ours:
                raise _staged_refusal(
                    path, f"holds {printable(name)}, which mnist2db never writes there"
                )
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
                kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                raise _staged_refusal(path, f"file {printable(where)} is {kind}")
            if info.st_nlink != 1:
                raise _staged_refusal(
                    path, f"file {printable(where)} has {info.st_nlink} names (a hard link)"
                )
        if _MADE[backend] in names:
            for check in _CHECKS[backend]:
                check(path, dir_fd)
    except OSError as exc:
        raise _staged_refusal(path, f"cannot be read ({exc.strerror})") from None
    except BackendError as exc:  # the checks of every database's open
        raise _staged_refusal(path, f"is damaged: {exc}") from None
    finally:
        os.close(dir_fd)


#: The free-page database's record in each meta page (MDB_meta: mm_magic, mm_version,
#: mm_address, mm_mapsize, then mm_dbs[FREE_DBI]): md_pad, md_flags, md_depth, the branch,
#: leaf and overflow pages, the entries and the root (liblmdb mdb.c), after the page header.
_FREE_DB = struct.Struct("@IHH5N")
_FREE_DB_AT = struct.calcsize("N") + 8 + struct.calcsize("@IINN")
_INTEGER_KEY = 0x08  # MDB_INTEGERKEY: the free database's keys are transaction ids
_NO_PAGE = (1 << (8 * struct.calcsize("N"))) - 1


def forget_free_pages(path: str) -> None:
    """Empty the free-page database of the staged LMDB ``path`` (both meta pages), and
    remove its lock file, before a writer opens it again: the page checks walk the tree a
    reader reaches, and a writer also reads the free pages and trusts the page numbers
    they list (a damaged one ends it with SIGBUS, or has it write over live pages). The
    pages the killed run freed are then never reused: a few pages a batch, left in the file.

    Raises:
        Mnist2dbError: the file cannot be written.
    """
    name = os.path.join(path, "data.mdb")
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
        try:
            page = _FREE_DB.unpack(os.pread(fd, _FREE_DB.size, _FREE_DB_AT))[0]
            empty = _FREE_DB.pack(page, _INTEGER_KEY, 0, 0, 0, 0, 0, _NO_PAGE)
            for meta in (0, page):
                os.pwrite(fd, empty, meta + _FREE_DB_AT)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, "lock.mdb"))
    except (OSError, struct.error) as exc:
        raise _staged_refusal(path, f"cannot be written ({exc})") from None


#: The checks of every open, before the backend maps the staged database (db_checks).
_CHECKS: dict[str, tuple[Callable[[str, int], None], ...]] = {
    "lmdb": (check_lmdb_file,),
    "leveldb": (check_leveldb_current, check_leveldb_logs),
}
#: What a backend's staged database needs before a writer opens it again (None: nothing).
_PREPARE: dict[str, Callable[[str], None] | None] = {"lmdb": forget_free_pages, "leveldb": None}


def check_staged_database(run: StagedRun, backend: str) -> Committed:
    """What the staged database of ``run`` holds (:func:`committed`), checked to be the
    one its plan made: the same file (device and inode), and the records, last key and last
    value the plan recorded before or after the batch being committed when the run was
    killed; then made ready to be written again (:func:`writable`).

    Raises:
        Mnist2dbError: one line naming what differs (the staged run is kept).
    """
    return _check_identity(run.path, backend, run.plan["staged"])


def check_staged_labels(run: StagedRun, path: str, backend: str) -> Committed:
    """:func:`check_staged_database` for the label database the killed run staged at
    ``path`` (the plan's ``labels_staged``)."""
    return _check_identity(path, backend, run.plan["labels_staged"])


def _check_identity(path: str, backend: str, staged: dict[str, Any] | None) -> Committed:
    done = committed(path, backend)
    state = committed_state(done)
    if staged is None:
        if done.records:
            raise _staged_refusal(
                path, f"holds {done.records} records, its plan none: not the database it made"
            )
        return writable(path, backend, done)
    info = os.lstat(os.path.join(path, IDENTITY_FILE[backend]))
    if (info.st_dev, info.st_ino) != (staged["device"], staged["inode"]):
        raise _staged_refusal(path, "is another file than the one its plan made (replaced)")
    if state not in staged["states"]:
        planned = " or ".join(f"{n} records up to {_shown_key(k)}" for n, k, _ in staged["states"])
        raise _staged_refusal(
            path,
            f"holds {done.records} records up to {_shown_key(state[1])}"
            + (" (another last value)" if state[:2] in [s[:2] for s in staged["states"]] else "")
            + f", its plan {planned} (another database, or one a power cut left behind: "
            "staged writes are not flushed)",
        )
    return writable(path, backend, done)


def writable(path: str, backend: str, done: Committed) -> Committed:
    """``done``, once the staged database at ``path`` is ready for a writer."""
    prepare = _PREPARE[backend]
    if prepare is not None and os.path.lexists(os.path.join(path, _MADE[backend])):
        prepare(path)
    return done


def _shown_key(key: str | None) -> str:
    return "no key" if key is None else printable(repr(bytes.fromhex(key)[:40])[2:-1])
