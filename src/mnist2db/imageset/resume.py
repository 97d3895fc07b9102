"""``--resume``: an imageset conversion killed part-way (SIGKILL, a power cut), continued.

Every conversion of :func:`mnist2db.imageset.to_database.write_imageset` writes its plan in its
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

from mnist2db.errors import Mnist2dbError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.storage.databases.backends import BACKEND
from mnist2db.storage.db_staging import stale_staging
from mnist2db.storage.digest_state import STATE_FILE
from mnist2db.storage.files import temp_prefix
from mnist2db.storage.owners import owner_pid, process_start

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


def owner_fields() -> dict[str, Any]:
    """What the plan records of the process that writes it: its start time, so that a
    live process that got the pid of a killed owner is not taken for it."""
    return {"owner": [os.getpid(), process_start(os.getpid())]}


def _owner_start(staging: str, pid: int) -> int | None:
    """The start time the plan in ``staging`` records of its owner when that is process
    ``pid`` (None: none, or another's: an adopted run's plan before it is written again)."""
    try:
        plan = read_plan(os.path.join(staging, PLAN_FILE))
    except Mnist2dbError:
        return None
    owner = plan.get("owner") if isinstance(plan, dict) else None
    if not isinstance(owner, list) or len(owner) != 2 or owner[0] != pid:
        return None
    return owner[1] if isinstance(owner[1], int) and not isinstance(owner[1], bool) else None


def find_staged_run(out: str) -> StagedRun | None:
    """The newest staged run for ``out`` left by a killed process, with a plan; None if none
    (a process gone: exited, exiting or a zombie, or its pid now another process's).

    Raises:
        Mnist2dbError: the newest plan is not one mnist2db writes (:func:`read_plan`).
    """
    for path in reversed(stale_staging(out, _owner_start)):
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
    "backend": (lambda v: isinstance(v, str) and v in BACKEND, "lmdb or leveldb"),
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
    for path in stale_staging(labels_out, lambda _, owner: _owner_start(images_staging, owner)):
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
    state = committed_state(done)
    for batch in batches:
        if batch:
            key, value = batch[-1]
            after = [state[0] + len(batch), bytes(key).hex(), hashlib.sha256(value).hexdigest()]
            plan[field] = _staged_identity(database or staging, backend, [state, after])
            write_plan(staging, plan, sync=False)  # per batch: a flush would cost more
            state = after
        yield batch


#: The file whose device and inode name a staged database: LMDB's ``data.mdb``; LevelDB's
#: directory (a compaction replaces its files).
IDENTITY_FILE = {"lmdb": "data.mdb", "leveldb": os.curdir}


def _staged_identity(staging: str, backend: str, states: list[list[Any]]) -> dict[str, Any]:
    """What names the staged database: its file's device and inode (LMDB's ``data.mdb``;
    LevelDB's directory, whose files a compaction replaces), and ``states``."""
    info = os.lstat(os.path.join(staging, IDENTITY_FILE[backend]))
    return {"device": info.st_dev, "inode": info.st_ino, "states": states}


def initial_identity(staging: str, backend: str, done: Committed) -> dict[str, Any] | None:
    """A resumed run's ``staged`` field before its first batch: what it adopted."""
    if not done.records or done.last_key is None:
        return None
    return _staged_identity(staging, backend, [committed_state(done)] * 2)


def committed_state(done: Committed) -> list[Any]:
    if done.last_key is None:
        return [done.records, None, None]
    return [done.records, done.last_key.hex(), done.last_digest]


def remove_plan(staging: str) -> None:
    for name in (PLAN_FILE, INPUTS_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(staging, name))


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


# -- the images a resume keeps -----------------------------------------------------------

#: The size and modification time of each committed record's image, in key order, appended
#: before each commit (line, size, mtime_ns: 24 bytes a record; removed with the plan).
INPUTS_FILE = "mnist2db-resume-inputs.bin"
_INPUT = struct.Struct(">qqq")
#: Every file mnist2db writes in a staged run besides the database's own (what a resume
#: accepts there: anything else is a stranger's).
STAGED_RUN_FILES = frozenset(
    {PLAN_FILE, PLAN_FILE + ".tmp", INPUTS_FILE, STATE_FILE, STATE_FILE + ".tmp"}
)


class InputRecorder:
    """Appends the size and mtime of each record's image before its batch commits (a
    writer's ``before_commit``): what a resume proves unchanged before it keeps the record."""

    def __init__(self, staging: str, root: bytes, committed: int) -> None:
        self.root = root
        self.path = os.path.join(staging, INPUTS_FILE)
        # A resumed run's file: cut to the records committed (a kill may have left the
        # batch that did not commit).
        with open(self.path, "ab") as stream:
            stream.truncate(min(os.fstat(stream.fileno()).st_size, committed * _INPUT.size))

    def __call__(self, items: Any) -> None:
        pack, root = _INPUT.pack, self.root
        parts = []
        for key, _ in items:
            stat = os.stat(root + bytes(key[9:]))
            parts.append(pack(int(key[:8]), stat.st_size, stat.st_mtime_ns))
        with open(self.path, "ab") as stream:
            stream.write(b"".join(parts))


def check_inputs(out: str, run: StagedRun, root: bytes, entries: Any, records: int) -> None:
    """Refuse a resume whose committed records' images changed since the staged run read
    them (their size or modification time), naming the first; the staged run is kept.

    Raises:
        Mnist2dbError: an image changed or is gone, or the run recorded fewer records than
            it committed (a run of an earlier version: nothing to prove them by).
    """
    path = os.path.join(run.path, INPUTS_FILE)
    try:
        with open(path, "rb") as stream:
            recorded = stream.read(records * _INPUT.size)
    except OSError:
        recorded = b""
    if len(recorded) < records * _INPUT.size:
        raise Mnist2dbError(
            f"{out}: --resume refused: the staged run recorded no size and time of "
            f"{records - len(recorded) // _INPUT.size} of its images (an earlier version's "
            "run); run without --resume to start again"
        )
    listed = iter(entries)
    entry = None
    for line, size, mtime in _INPUT.iter_unpack(recorded):
        while entry is None or entry.line < line:
            entry = next(listed, None)
            if entry is None:
                break
        if entry is None or entry.line != line:
            raise Mnist2dbError(
                f"{out}: --resume refused: the staged run's record of line {line + 1} names "
                "no entry of the list; run without --resume to start again"
            )
        name = root + entry.path
        try:
            stat = os.stat(name)
            found: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            found = None
        if found != (size, mtime):
            what = "is gone" if found is None else "changed since the staged run read it"
            raise Mnist2dbError(
                f"{printable(os.fsdecode(name))}: --resume refused: the image {what} (its "
                f"record is committed in the staged run of {out}); run without --resume to "
                "start again"
            )
