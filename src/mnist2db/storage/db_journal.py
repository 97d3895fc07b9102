"""Databases that appear together or not at all (an image database and its label
database): the journal that makes placing several staged databases one step.

Two renames are not one step. :func:`place_journalled` writes a journal beside the first
destination naming every database and its staging directory, places them, and removes the
journal once all are placed (the commit point); a failure rolls back what was placed. A
run killed in between leaves the journal, and the next writer of any of those databases
(:func:`recover_databases`, called by :mod:`mnist2db.storage.db_staging` before it judges
a destination) rolls it back the same way. Staging itself, and the checks before it, are
:mod:`mnist2db.storage.db_staging`'s.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from mnist2db.errors import OutputError
from mnist2db.storage import files
from mnist2db.storage.files import (
    fsync_dir,
    owner_pid,
    pid_alive,
    read_journal,
    remove_stale,
    swap,
    temp_prefix,
    write_journal,
)

if TYPE_CHECKING:
    from typing import Any

#: ``.<name>.mnist2db-dbpair-<pid>-<random>``: the journal of databases being placed together.
_DBPAIR_MARK = ".mnist2db-dbpair-"
#: The largest journal read (a few paths a database).
_JOURNAL_LIMIT = 1 << 16


def _identity(path: str) -> list[int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _journal_path(out: str) -> str:
    parent, name = os.path.split(os.path.abspath(out))
    prefix = temp_prefix(name).replace(".mnist2db-tmp-", _DBPAIR_MARK)
    return os.path.join(parent, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")


def place_journalled(
    stagings: list[str], outs: list[str], place: Callable[[str, str], bool]
) -> list[bool]:
    """Place every staged database, ``place(staging, out)`` each (True: it swapped an old
    database out into ``staging``), under a journal; which ones swapped an old one out.

    The journal beside the first destination names every database and its staging
    directory before the first is placed, and is removed once all are (the commit point).
    A failure puts back what was placed (a replaced database swapped back); a kill leaves
    the journal for :func:`recover_databases`.

    Raises:
        OutputError: the journal cannot be written; or what ``place`` raises.
    """

    entries = [
        {"target": os.path.abspath(out), "staging": staging, "new": _identity(staging),
         "replaces": os.path.lexists(out)}
        for staging, out in zip(stagings, outs, strict=True)
    ]  # fmt: skip
    journal = _journal_path(outs[0])
    try:
        write_journal(journal, entries)
    except OSError as exc:
        raise OutputError(f"{outs[0]}: cannot write in its directory: {exc.strerror}") from None
    placed: list[dict[str, Any]] = []
    try:
        for entry, staging, out in zip(entries, stagings, outs, strict=True):
            swapped = place(staging, out)
            entry["replaces"] = swapped
            placed.append(entry)
            if len(placed) == 1:
                files.checkpoint("databases-first", out)
        os.unlink(journal)  # the commit point
        fsync_dir(os.path.dirname(journal))
    except BaseException:
        for entry in reversed(placed):
            with contextlib.suppress(OSError):
                _roll_back(entry)
        with contextlib.suppress(OSError):
            os.unlink(journal)
        raise
    return [bool(entry["replaces"]) for entry in entries]


def _roll_back(entry: dict[str, Any]) -> None:
    """Undo one placement of a journal, only while the target still is the database placed."""
    target, staging = entry["target"], entry["staging"]
    if _identity(target) != entry["new"]:
        return  # never placed, or replaced since by someone else: left alone
    if entry.get("replaces") and os.path.lexists(staging):
        swap(staging, target)  # the old database back; the new one in the staging name
    elif not os.path.lexists(staging):
        os.rename(target, staging)
    fsync_dir(os.path.dirname(target))


def recover_databases(out: str | os.PathLike[str]) -> None:
    """Roll back databases that a killed
    :func:`~mnist2db.storage.db_staging.staged_databases` placed only in part, when
    ``out`` is one of them: each one placed is put back as it was (while it still is the
    one placed), and the journal removed. A run still going is left alone; a file that is
    not such a journal (a FIFO, a link, a large file, one naming other paths) is never read
    on, never removed."""
    out = os.path.abspath(os.fspath(out))
    parent = os.path.dirname(out)
    try:
        found = [e for e in os.scandir(parent) if _DBPAIR_MARK in e.name]
    except OSError:
        return
    for entry in found:
        pid = owner_pid(entry.name.rpartition(_DBPAIR_MARK)[2])
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        journal = read_journal(entry.path, _JOURNAL_LIMIT)
        if not isinstance(journal, list):
            continue
        records = [r for r in journal if _journalled(r, pid)]
        if journal and (len(records) != len(journal) or out not in (r["target"] for r in records)):
            continue
        for record in reversed(records):
            with contextlib.suppress(OSError):
                _roll_back(record)
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
        for record in records:  # the staging of every one of them, the dead run's
            target = record["target"]
            remove_stale(parent, temp_prefix(os.path.basename(target)), directories=True)


def _journalled(record: object, pid: int) -> bool:
    """A journal entry as :func:`place_journalled` writes them, naming a staging directory
    of the dead process beside its target: anything else is not acted on."""
    if not isinstance(record, dict):
        return False
    target, staging = record.get("target"), record.get("staging")
    if not (isinstance(target, str) and isinstance(staging, str)):
        return False
    parent, name = os.path.split(staging)
    prefix = f"{temp_prefix(os.path.basename(target))}{pid}-"
    return (
        os.path.dirname(target) == parent
        and name.startswith(prefix)
        and isinstance(record.get("new"), list)
    )
