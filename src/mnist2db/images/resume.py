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
import struct

from mnist2db.errors import Mnist2dbError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.image_list import ListEntry
from mnist2db.storage.db_staging import stale_staging
from mnist2db.storage.digest_state import saved_count
from mnist2db.storage.files import owner_pid, process_start, temp_prefix

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
        with open(os.path.join(staging, PLAN_FILE), encoding="utf-8") as stream:
            owner = json.load(stream).get("owner")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(owner, list) or len(owner) != 2 or owner[0] != pid:
        return None
    return owner[1] if isinstance(owner[1], int) else None


def find_staged_run(out: str) -> StagedRun | None:
    """The newest staged run for ``out`` left by a killed process, with a plan; None if none
    (a process gone: exited, exiting or a zombie, or its pid now another process's)."""
    for path in reversed(stale_staging(out, _owner_start)):
        try:
            with open(os.path.join(path, PLAN_FILE), encoding="utf-8") as stream:
                plan = json.load(stream)
        except (OSError, ValueError):
            continue
        if isinstance(plan, dict):
            return StagedRun(path, plan)
    return None


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


def write_plan(staging: str, plan: dict[str, Any]) -> None:
    """The plan, written whole (a kill leaves it complete or absent)."""
    temporary = os.path.join(staging, PLAN_FILE + ".tmp")
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(plan, stream, sort_keys=True)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, os.path.join(staging, PLAN_FILE))


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


#: The file that says a staged directory holds a database yet (a label database is staged
#: empty until the images are all written).
_MADE = {"lmdb": "data.mdb", "leveldb": "CURRENT"}


def _lmdb_keys(path: str) -> tuple[int, bytes | None, bytes | None]:
    import lmdb

    env = lmdb.open(
        os.fsencode(os.path.join(path, "data.mdb")), readonly=True, lock=False, subdir=False
    )
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            first = cursor.key() if cursor.first() else None
            last = cursor.key() if cursor.last() else None
            return int(env.stat()["entries"]), first, last
    finally:
        env.close()


def _leveldb_keys(path: str) -> tuple[int, bytes | None, bytes | None]:
    import plyvel

    db = plyvel.DB(os.fsencode(path), create_if_missing=False)
    try:
        first = next(db.iterator(include_value=False), None)
        last = next(db.iterator(include_value=False, reverse=True), None)
        # LevelDB keeps no count: the one saved with the digest's state at that last key
        # (every commit saves one), else counted key by key (a run of an earlier version).
        records = saved_count(path, last)
        if records is None:
            records = sum(1 for _ in db.iterator(include_value=False))
        return records, first, last
    finally:
        db.close()


#: How each backend's committed keys are counted (its own reader, read-only).
_KEYS = {"lmdb": _lmdb_keys, "leveldb": _leveldb_keys}


def committed(path: str, backend: str) -> Committed:
    """What the staged database at ``path`` holds (its committed batches).

    Raises:
        Mnist2dbError: it cannot be read.
    """
    if not os.path.exists(os.path.join(path, _MADE[backend])):
        return Committed(0, -1, None)
    try:
        records, first, last = _KEYS[backend](path)
    except Exception as exc:  # the backends' own errors: one line
        raise Mnist2dbError(
            f"{path}: --resume: the staged database cannot be read: {exc}; run without "
            "--resume to start again"
        ) from None
    return Committed(records, -1 if last is None else int(last[:8]), first, last)


# -- the images a resume keeps -----------------------------------------------------------

#: The size and modification time of each committed record's image, in key order, appended
#: before each commit (line, size, mtime_ns: 24 bytes a record; removed with the plan).
INPUTS_FILE = "mnist2db-resume-inputs.bin"
_INPUT = struct.Struct(">qqq")


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
