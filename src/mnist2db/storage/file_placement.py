"""Where a finished output may go (:func:`check_file_target`), and outputs that appear
together or not at all: export's image and label files, an image database and its label
database.

Two renames cannot be one atomic step, so :func:`place_all` keeps one journal while it
places a set of finished stagings (files or database directories), rolls back on failure,
and :func:`recover_together` rolls back a set whose writer was killed half-way, the next
time one of them is written. Nothing is ever removed that the run did not write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Callable, Iterator, Sequence

from mnist2db.errors import ArgumentError, OutputError, OutputExistsError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.storage import files as file_system
from mnist2db.storage.destinations import check_apart, check_parent, symlink_refusal
from mnist2db.storage.files import (
    TEMP_MARK,
    AtomicFile,
    fsync_dir,
    read_journal,
    remove_stale,
    swap,
    temp_prefix,
    write_journal,
)
from mnist2db.storage.owners import owner_pid, pid_alive

if TYPE_CHECKING:
    from typing import Any

#: ``.<first output>.mnist2db-pair-<pid>-<random>``: the journal of outputs being placed.
_PAIR_MARK = ".mnist2db-pair-"
#: The largest journal read (a few paths and numbers an output).
_JOURNAL_LIMIT = 1 << 20


def check_file_target(
    path: str,
    overwrite: bool,
    inputs: Sequence[str | os.PathLike[str]] = (),
    *,
    makes_parents: bool = False,
) -> None:
    """Raise unless a finished file may be moved to ``path`` (refused before any work).

    The rule every file output follows (``mean``, ``show --png``, ``export``, the mean of
    ``compute_image_mean``): never a link, a directory or a special file, an existing file
    only with ``overwrite``, and never one of ``inputs`` of the same run nor a file inside
    one (:func:`mnist2db.storage.destinations.check_apart`). ``makes_parents``: the caller creates a
    missing directory (``export``); otherwise a directory that does not exist is refused
    here, not after the work.

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is false, or it is anything
            but a regular file (a directory, a symbolic link, a FIFO, ...), or is (or is
            inside) one of ``inputs``.
        Mnist2dbError: its directory does not exist (and ``makes_parents`` is false), or
            is named through ``..`` after a directory that does not exist.
    """
    if not path:
        raise ArgumentError("the output path is empty: name a file to create")
    check_apart(path, inputs)
    if os.path.islink(path):
        raise symlink_refusal(path)
    if not os.path.lexists(path):
        check_parent(path, makes_parents=makes_parents)
        _check_writable(path)
        return
    if os.path.isdir(path):
        raise OutputExistsError(
            f"{path}: is a directory; refusing to replace it (even with --overwrite)"
        )
    if not os.path.isfile(path):
        raise OutputExistsError(
            f"{path}: is not a regular file; refusing to replace it (even with --overwrite)"
        )
    if not overwrite:
        raise OutputExistsError(f"{path}: already exists (use --overwrite to replace it)")
    _check_writable(path)


def _check_writable(path: str) -> None:
    """Refuse a file that could not be created where it goes (its directory, or the nearest
    one that exists when the caller creates the rest), before the work rather than after."""
    directory = os.path.dirname(path) or os.curdir
    while not os.path.exists(directory):
        up = os.path.dirname(directory) or os.curdir
        if up == directory:
            break
        directory = up
    mode = os.W_OK | os.X_OK
    if os.access in os.supports_effective_ids:
        allowed = os.access(directory, mode, effective_ids=True)
    else:
        allowed = os.access(directory, mode)
    if allowed:
        return
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    reason = "a read-only file system" if read_only else "no permission to create files there"
    raise OutputError(f"{path}: cannot write in {directory} ({reason})")


# -- outputs that appear together ----------------------------------------------------------


def _identity(path: str) -> list[int] | None:
    """What tells this very output apart: device and inode, and for a file its size and
    modification time too (an inode number alone is reused as soon as a file is deleted)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return [st.st_dev, st.st_ino]
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def place_all(
    stagings: Sequence[str],
    outs: Sequence[str],
    place: Callable[[str, str], bool],
    *,
    checkpoint: str,
) -> list[bool]:
    """Place every staging, ``place(staging, out)`` each (True: it swapped an old output out
    into ``staging``), under one journal; which ones swapped an old one out.

    The journal beside the first destination names every output, its staging and the
    identity of what is placed before the first is placed, and is removed once all are (the
    commit point). A failure puts back what was placed (a replaced output swapped back, a
    new one moved back to its staging name); a kill leaves the journal for
    :func:`recover_together`. ``checkpoint``: the fault tests' name for the moment the first
    is placed.

    Raises:
        OutputError: the journal cannot be written; or what ``place`` raises.
    """
    entries = [
        {"target": os.path.abspath(out), "staging": staging, "new": _identity(staging),
         "replaces": os.path.lexists(out)}
        for staging, out in zip(stagings, outs, strict=True)
    ]  # fmt: skip
    parent, name = os.path.split(os.path.abspath(outs[0]))
    prefix = temp_prefix(name).replace(TEMP_MARK, _PAIR_MARK)
    journal = os.path.join(parent, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
    try:
        write_journal(journal, entries)
    except OSError as exc:
        raise OutputError(f"{outs[0]}: cannot write in its directory: {exc.strerror}") from None
    placed: list[dict[str, Any]] = []
    try:
        for entry, staging, out in zip(entries, stagings, outs, strict=True):
            entry["replaces"] = place(staging, out)
            placed.append(entry)
            if len(placed) == 1:
                file_system.checkpoint(checkpoint, out)
        fsync_dir(parent)
        os.unlink(journal)  # the commit point
        fsync_dir(parent)
    except BaseException:
        for entry in reversed(placed):
            with contextlib.suppress(OSError):
                _roll_back(entry)
        with contextlib.suppress(OSError):
            os.unlink(journal)
        raise
    return [bool(entry["replaces"]) for entry in entries]


def _roll_back(entry: dict[str, Any]) -> None:
    """Undo one placement of a journal, only while the target still is the output placed."""
    target, staging = entry["target"], entry["staging"]
    if _identity(target) != entry["new"]:
        return  # never placed, or replaced since by someone else: theirs stays
    if entry.get("replaces") and os.path.lexists(staging):
        swap(staging, target)  # the old output back; the new one in the staging name
    elif not os.path.lexists(staging):
        os.rename(target, staging)
    fsync_dir(os.path.dirname(target))


def place_together(files: Sequence[AtomicFile]) -> None:
    """Move finished :class:`~mnist2db.storage.files.AtomicFile` temporaries to their paths,
    all or none (:func:`place_all`; the checkpoint ``"pair-first"``). Callers check the
    targets first (:func:`check_file_target`); a file each replaces is swapped into its
    temporary's name and removed once all are placed.

    Raises:
        OSError: naming the file that could not be finished or moved.
    """
    for file in files:
        file.finish()
    with _directory_lock(os.path.dirname(os.path.abspath(files[0].path))):
        swapped = place_all([f.temp for f in files], [f.path for f in files], _place_file,
                            checkpoint="pair-first")  # fmt: skip
    for file, old in zip(files, swapped, strict=True):
        file.committed = True
        if old:
            with contextlib.suppress(OSError):
                os.unlink(file.temp)  # the file it replaced


def _place_file(temp: str, path: str) -> bool:
    """Move ``temp`` to ``path``; True if an old file was swapped out into ``temp``. Only a
    regular file is swapped: anything else there (a directory made meanwhile) is refused,
    as ``os.replace`` refuses it."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            swap(temp, path)
            return True
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    try:
        os.replace(temp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    return False


@contextlib.contextmanager
def _directory_lock(directory: str) -> Iterator[None]:
    """Hold an exclusive flock on ``directory`` so that two writers of the same pair place
    theirs one after the other, never interleaved (where flock is not supported: no lock)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def recover_together(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Roll back what a killed :func:`place_all` of outputs among ``paths`` left.

    A journal of a process that no longer exists, named for the first of ``paths`` or
    naming one of them, means its outputs were not all placed: each one it placed is put
    back as it was (only while it still is the output that run placed), the journal
    removed, and the dead run's stagings of them. A run still going is left alone; a file
    that is not such a journal (a FIFO, a link, a large file) is never read on, never
    removed; an entry not as :func:`place_all` writes them, or for an output neither among
    ``paths`` nor beside the journal, moves nothing.
    """
    wanted = [os.path.abspath(os.fspath(p)) for p in paths]
    parent, first = os.path.split(wanted[0])
    named = temp_prefix(first).replace(TEMP_MARK, _PAIR_MARK)
    try:
        found = [e for e in os.scandir(parent) if _PAIR_MARK in e.name]
    except OSError:
        return
    for entry in found:
        pid = owner_pid(entry.name.rpartition(_PAIR_MARK)[2])
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        journal = read_journal(entry.path, _JOURNAL_LIMIT)
        if journal is None:
            continue
        records = [
            r
            for r in (journal if isinstance(journal, list) else [])
            if _journalled(r, pid)
            and (r["target"] in wanted or os.path.dirname(r["target"]) == parent)
        ]  # (an output elsewhere is no set's placed beside its journal: never acted on)
        if not entry.name.startswith(named) and not any(r["target"] in wanted for r in records):
            continue  # another set's journal
        for record in reversed(records):
            with contextlib.suppress(OSError):
                _roll_back(record)
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
        for target in {*wanted, *(r["target"] for r in records)}:
            prefix = temp_prefix(os.path.basename(target))
            remove_stale(os.path.dirname(target), prefix, directories=True)
            remove_stale(os.path.dirname(target), prefix, directories=False)


def _journalled(record: object, pid: int) -> bool:
    """A journal entry as :func:`place_all` writes them, naming a staging of the dead
    process beside its target: anything else is not acted on."""
    if not isinstance(record, dict):
        return False
    target, staging = record.get("target"), record.get("staging")
    if not (isinstance(target, str) and isinstance(staging, str)):
        return False
    parent, name = os.path.split(staging)
    prefix = f"{temp_prefix(os.path.basename(target))}{pid}-"
    return (
        os.path.realpath(os.path.dirname(target)) == os.path.realpath(parent)
        and name.startswith(prefix)
        and isinstance(record.get("new"), list)
    )
