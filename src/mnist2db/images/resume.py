"""``--resume``: an imageset conversion killed part-way (SIGKILL, a power cut), continued.

Every conversion of :func:`mnist2db.images.datum_records.write_imageset` writes its plan in its
staging directory first (:data:`PLAN_FILE`: the root, the list's name, a digest of every
entry in order, the options that make a record, the backend, the shuffle seed). A killed run leaves that directory beside the destination, named for its dead
process (:mod:`mnist2db.storage.db_staging`). ``--resume`` adopts it when its plan is this
run's: the batches it committed stay (their keys, ``%08d_PATH``, say up to which entry of
the list), the entries after the last committed one are converted again, and the records
are those of an uninterrupted run. A plan that differs is refused in one line naming what
differs. SIGINT and SIGTERM are not kills: they remove the staging directory, as always.

A label database beside (:mod:`mnist2db.labels.databases`) is staged by the same process
(:func:`find_staged_labels` finds it by that process's id) and written after the images:
the plan holds a digest of its label file too, and the resumed run adopts both staging
directories, keeping the label records committed (which must end at the image key of the
same record) and adding the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator

from mnist2db.errors import BackendError, Mnist2dbError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.image_list import ListEntry
from mnist2db.storage.db_staging import stale_staging
from mnist2db.storage.files import owner_pid, temp_prefix

if TYPE_CHECKING:
    from typing import Any

#: The plan's file in a staging directory (removed before the database is placed).
PLAN_FILE = "mnist2db-resume.json"

#: What each planned value is called in a refusal.
_NAMES = {
    "backend": "--backend", "gray": "--gray", "resize": "the resize", "encoded": "--encoded",
    "encode_type": "--encode_type", "check_size": "--check_size",
    "root": "the root folder", "list": "the list",
    "lines": "the number of listed images", "entries": "the list's entries",
    "seed": "the shuffle seed", "width": "the number of values an image has",
    "targets": "the label values",
}  # fmt: skip


@named_tuple
class StagedRun(NamedTuple):
    """A killed run's staging directory and its plan."""

    path: str
    plan: dict[str, Any]


@named_tuple
class Committed(NamedTuple):
    """What a staged database holds: ``records``, the list line of its last key (-1: none),
    its first key and its last key (None: empty)."""

    records: int
    last_line: int
    first_key: bytes | None
    last_key: bytes | None = None
    last_digest: str | None = None  # SHA-256 of the last record's value


class EntryDigest:
    """A digest of entries in order (line, label, path), fed one at a time (hashed a few
    thousand at a time: one update each is most of a list's check)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._pending: list[bytes] = []

    def add(self, entry: ListEntry) -> None:
        pending = self._pending
        pending.append(b"%d %d %d:%s" % (entry.line, entry.label, len(entry.path), entry.path))
        if len(pending) >= _DIGEST_BATCH:
            self._flush()

    def hexdigest(self) -> str:
        self._flush()
        return self._hash.hexdigest()

    def _flush(self) -> None:
        self._hash.update(b"".join(self._pending))
        self._pending.clear()


_DIGEST_BATCH = 4096


def find_staged_run(out: str) -> StagedRun | None:
    """The newest staged run for ``out`` left by a killed process, with a plan; None if none.

    Raises:
        Mnist2dbError: the newest plan is not one mnist2db writes (:func:`read_plan`).
    """
    for path in reversed(stale_staging(out)):
        plan = read_plan(os.path.join(path, PLAN_FILE))
        if plan is not None:
            return StagedRun(path, plan)
    return None


#: The largest plan read (bytes): a plan is a few hundred bytes.
PLAN_LIMIT = 1 << 20
#: A digest as the plan records it (SHA-256, in hex).
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
#: Caffe's key, as a staged database must hold it: the line's ``%08d_``, then the path.
CAFFE_KEY = re.compile(rb"[0-9]{8}_", re.ASCII)


def read_plan(path: str) -> dict[str, Any] | None:
    """The plan at ``path``, read as a stranger's file (no link followed, nothing but a
    regular file of at most :data:`PLAN_LIMIT` bytes) and checked by :func:`check_plan_schema`;
    None when there is none (a run killed before it wrote one).

    Raises:
        Mnist2dbError: one line naming the file and what is wrong.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _plan_refusal(path, f"cannot be read ({exc.strerror}; a link?)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _plan_refusal(path, "is not a regular file")
        if info.st_size > PLAN_LIMIT:
            raise _plan_refusal(
                path, f"holds {info.st_size} bytes, more than a plan's {PLAN_LIMIT}"
            )
        data = os.read(fd, PLAN_LIMIT + 1)
    except OSError as exc:
        raise _plan_refusal(path, f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    try:
        plan = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise _plan_refusal(path, "is not JSON (UTF-8)") from None
    check_plan_schema(path, plan)
    return plan  # type: ignore[no-any-return]


def _plan_refusal(path: str, what: str) -> Mnist2dbError:
    return Mnist2dbError(
        f"{printable(path)}: --resume refused: the staged run's plan {what}: not a plan mnist2db "
        "wrote; the staged run was kept (run without --resume to start again)"
    )


def _is_int(value: Any, low: int = 0) -> bool:
    return type(value) is int and low <= value < 1 << 63


def _is_key(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 2 * 511 or len(value) % 2:
        return False
    try:
        return CAFFE_KEY.match(bytes.fromhex(value)) is not None
    except ValueError:
        return False


def _is_state(value: Any) -> bool:
    """``[records, last key in hex, SHA-256 of the last value]`` (``[0, null, null]``)."""
    if not isinstance(value, list) or len(value) != 3 or not _is_int(value[0]):
        return False
    if value[0] == 0:
        return value[1] is None and value[2] is None
    return _is_key(value[1]) and isinstance(value[2], str) and bool(_HEX_DIGEST.fullmatch(value[2]))


def _is_staged(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) != {"device", "inode", "states"}:
        return False
    states = value["states"]
    return (
        _is_int(value["device"])
        and _is_int(value["inode"])
        and isinstance(states, list)
        and 1 <= len(states) <= 2
        and all(_is_state(state) for state in states)
    )


#: Each field of a plan and what it must hold: ``(test, what)``.
_SCHEMA: dict[str, tuple[Callable[[Any], bool], str]] = {
    "root": (lambda v: isinstance(v, str), "a text"),
    "list": (lambda v: isinstance(v, str), "a text"),
    "entries": (lambda v: isinstance(v, str) and bool(_HEX_DIGEST.fullmatch(v)), "a digest"),
    "lines": (lambda v: _is_int(v) and v <= 10**8, "a count of lines"),
    "backend": (lambda v: v in ("lmdb", "leveldb"), "lmdb or leveldb"),
    "gray": (lambda v: type(v) is bool, "true or false"),
    "resize": (
        lambda v: v is None or (isinstance(v, list) and len(v) == 2
                                and all(_is_int(n, 1) for n in v)),
        "null or [width, height]",
    ),
    "encoded": (lambda v: type(v) is bool, "true or false"),
    "encode_type": (lambda v: v is None or isinstance(v, str), "null or a text"),
    "check_size": (lambda v: type(v) is bool, "true or false"),
    "seed": (lambda v: v is None or _is_int(v), "null or a seed"),
    "width": (lambda v: v is None or (_is_int(v, 1) and v <= 1 << 20), "null or a width"),
    "targets": (
        lambda v: v is None or (isinstance(v, str) and bool(_HEX_DIGEST.fullmatch(v))),
        "null or a digest",
    ),
    "staged": (_is_staged, "null or the staged database's identity"),
    "labels_staged": (_is_staged, "null or the staged label database's identity"),
}  # fmt: skip


def check_plan_schema(path: str, plan: Any) -> None:
    """Raise unless ``plan`` (read from ``path``) holds every field of :data:`_SCHEMA`, each
    of its type (fields it does not name are never read).

    Raises:
        Mnist2dbError: one line naming the file and the field.
    """
    if not isinstance(plan, dict):
        raise _plan_refusal(path, f"is a JSON {type(plan).__name__}, not an object")
    for field, (test, what) in _SCHEMA.items():
        if field not in plan:
            raise _plan_refusal(path, f"has no field {field!r}")
        if not test(plan[field]):
            shown = printable(json.dumps(plan[field])[:40])
            raise _plan_refusal(path, f"field {field!r} holds {shown}, not {what}")


def find_staged_labels(out: str, labels_out: str, images_staging: str) -> str | None:
    """The staging directory of the label database ``labels_out`` that the killed process
    which left ``images_staging`` (the image database ``out``'s) made beside it; None if
    it made none."""

    def pid_of(path: str, target: str) -> int | None:
        prefix = temp_prefix(os.path.basename(os.path.normpath(target)))
        return owner_pid(os.path.basename(path)[len(prefix) :])

    pid = pid_of(images_staging, out)
    for path in stale_staging(labels_out):
        if pid is not None and pid_of(path, labels_out) == pid:
            return path
    return None


def staged_seed(out: str) -> int:
    """The shuffle seed of the staged run ``--resume`` would continue (-1: none recorded)."""
    run = find_staged_run(out)
    seed = None if run is None else run.plan.get("seed")
    return seed if isinstance(seed, int) else -1


def write_plan(staging: str, plan: dict[str, Any], *, sync: bool = True) -> None:
    """The plan, written whole (a kill leaves it complete or absent; without ``sync``, a
    power cut may leave it older, or damaged: a resume then refuses it)."""
    temporary = os.path.join(staging, PLAN_FILE + ".tmp")
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(plan, stream, sort_keys=True)
        stream.flush()
        if sync:
            os.fsync(stream.fileno())
    os.replace(temporary, os.path.join(staging, PLAN_FILE))


def recording_batches(
    batches: Iterator[list[tuple[bytes, bytes]]],
    staging: str,
    plan: dict[str, Any],
    backend: str,
    done: Committed,
    *,
    field: str = "staged",
    database: str | None = None,
) -> Iterator[list[tuple[bytes, bytes]]]:
    """``batches``, each one's outcome recorded in the plan (in ``staging``, under
    ``field``) before it is committed: the identity of the staged database (``database``,
    default ``staging``; ``labels_staged``: the label database's) and the two states it may
    then hold (records, last key and last value's digest before the batch, and after),
    which a resume checks (:func:`check_staged_database`). The writer asks for a batch
    once the one before is committed, and has opened the database by then (its file
    exists when the first batch is asked for)."""
    state = _state(done)
    for batch in batches:
        if batch:
            key, value = batch[-1]
            after = [state[0] + len(batch), bytes(key).hex(), hashlib.sha256(value).hexdigest()]
            plan[field] = _staged_identity(database or staging, backend, [state, after])
            write_plan(staging, plan, sync=False)  # per batch: a flush would cost more
            state = after
        yield batch


def _staged_identity(staging: str, backend: str, states: list[list[Any]]) -> dict[str, Any]:
    """What names the staged database: its file's device and inode (LMDB's ``data.mdb``;
    LevelDB's directory, whose files a compaction replaces), and ``states``."""
    info = os.lstat(os.path.join(staging, "data.mdb") if backend == "lmdb" else staging)
    return {"device": info.st_dev, "inode": info.st_ino, "states": states}


def initial_identity(staging: str, backend: str, done: Committed) -> dict[str, Any] | None:
    """A resumed run's ``staged`` field before its first batch: what it adopted."""
    if not done.records or done.last_key is None:
        return None
    return _staged_identity(staging, backend, [_state(done)] * 2)


def _state(done: Committed) -> list[Any]:
    if done.last_key is None:
        return [done.records, None, None]
    return [done.records, done.last_key.hex(), done.last_digest]


def remove_plan(staging: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(staging, PLAN_FILE))


def check_plan(out: str, run: StagedRun, plan: dict[str, Any]) -> None:
    """Raises Mnist2dbError naming the first difference between ``run``'s plan and ``plan``."""
    keys = list(_NAMES)
    if (plan.get("targets") is None) != (run.plan.get("targets") is None):
        keys = ["targets"]  # a label database beside in one run only: that first
    for key in keys:
        name = _NAMES[key]
        if key in ("seed",) and plan.get(key) is None:
            continue  # a shuffle given no seed takes the staged one
        if run.plan.get(key) != plan.get(key):
            if key == "targets" and plan.get(key) is None:
                what = (
                    "were written by the staged run (a label database beside: give "
                    "--labels or --values again)"
                )
            elif key == "targets" and run.plan.get(key) is None:
                what = "were not written by the staged run (it made no label database)"
            elif key == "targets":
                what = "differ from the staged run's (the label file changed)"
            elif key == "entries":
                what = "differ from the staged run's (the list file changed, or the order)"
            else:
                what = f"is {_show(plan.get(key))}, the staged run's {_show(run.plan.get(key))}"
            raise Mnist2dbError(
                f"{out}: --resume refused: {name} {what}; run without --resume to start again"
            )


def _show(value: Any) -> str:
    if value is None or value is False:
        return "none" if value is None else "off"
    if value is True:
        return "on"
    if isinstance(value, list):
        return " × ".join(map(str, value))
    return printable(str(value))


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
        first = last = value = None
        records = 0
        for key in db.iterator(include_value=False):
            first = first or key
            last = key
            records += 1
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
    every database passes before its backend opens it (:mod:`mnist2db.storage.db_checks`:
    LMDB's pages, a ``data.mdb`` cut short; LevelDB's ``CURRENT`` and logs): a link would
    send the resumed writes into another database, a cut file end the process with SIGBUS.

    Raises:
        Mnist2dbError: one line naming the file and what is wrong.
    """
    from mnist2db.storage.db_checks import (
        check_leveldb_current,
        check_leveldb_logs,
        check_lmdb_file,
    )
    from mnist2db.storage.targets import is_owned_file

    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        dir_fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _staged_refusal(path, f"cannot be opened ({exc.strerror})") from None
    try:
        names = os.listdir(dir_fd)
        for name in names:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            ours = name in (PLAN_FILE, PLAN_FILE + ".tmp") or is_owned_file(backend, name)
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
        made = _MADE[backend] in names
        if made and backend == "lmdb":
            check_lmdb_file(path, dir_fd)
        elif made:
            check_leveldb_current(path, dir_fd)
            check_leveldb_logs(path, dir_fd)
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
    state = _state(done)
    if staged is None:
        if done.records:
            raise _staged_refusal(
                path, f"holds {done.records} records, its plan none: not the database it made"
            )
        return writable(path, backend, done)
    info = os.lstat(os.path.join(path, "data.mdb") if backend == "lmdb" else path)
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
    if backend == "lmdb" and os.path.lexists(os.path.join(path, "data.mdb")):
        forget_free_pages(path)
    return done


def _shown_key(key: str | None) -> str:
    return "no key" if key is None else printable(repr(bytes.fromhex(key)[:40])[2:-1])
