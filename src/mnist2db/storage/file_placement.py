"""Files that appear together or not at all: export's image and label files.

Two renames cannot be one atomic step, so :func:`place_together` keeps a journal while it
places a set of finished temporaries, rolls back on failure, and :func:`recover_together`
rolls back a set whose writer was killed half-way, the next time the same files are
written. Nothing is ever removed that the run did not write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from mnist2db.errors import ArgumentError, OutputError, OutputExistsError
from mnist2db.storage import files as file_system
from mnist2db.storage.destinations import check_apart, check_parent, symlink_refusal
from mnist2db.storage.files import (
    TEMP_MARK,
    AtomicFile,
    fsync_dir,
    owner_pid,
    pid_alive,
    read_journal,
    remove_stale,
    temp_prefix,
    write_journal,
)

# -- files that appear together: export's image and label files -------------------------------

#: ``.<first file>.mnist2db-pair-<pid>-<random>``: the record of a pair being placed.
_PAIR_MARK = ".mnist2db-pair-"
#: ``.<file>.mnist2db-old-<pid>-<random>``: a hard link to the file a pair replaces.
_OLD_MARK = ".mnist2db-old-"


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


def _hidden_name(path: str, mark: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    prefix = temp_prefix(name).replace(TEMP_MARK, mark)
    return os.path.join(directory, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")


def _version(path: str) -> list[int] | None:
    """What tells this very file version apart: device, inode, size and modification time
    (an inode number alone is reused as soon as a file is deleted)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _restore(entry: dict[str, Any]) -> None:
    """Put back what ``entry`` (one file of a journal) replaced, if the new file is still there."""
    target, backup, new = entry["target"], entry.get("backup"), entry["new"]
    current = _version(target)
    if backup is not None and os.path.lexists(backup):
        if current is not None and current in (new, _version(backup)):
            os.replace(backup, target)
        else:
            os.unlink(backup)  # the user replaced the file since: theirs stays
    elif backup is None and current is not None and current == new:
        os.unlink(target)  # it did not exist before this run made it


def place_together(files: Sequence[AtomicFile]) -> None:
    """Move finished :class:`~mnist2db.storage.files.AtomicFile` temporaries to their paths, all or none.

    Callers check the targets first (:func:`check_file_target`). Each existing target is
    first hard-linked to a hidden backup, and a journal naming the files is written and
    flushed; then the files are renamed into place, the journal removed (the commit
    point) and the backups dropped. A failure rolls back the files already placed; a kill
    leaves the journal, and :func:`recover_together` (run by the next writer of the same
    files) rolls back from it. Never more than what this run wrote is removed: a target
    is put back only while it still is the file this run placed.

    Raises:
        OSError: naming the file that could not be finished, linked or moved.
    """
    for file in files:
        file.finish()
    with _directory_lock(os.path.dirname(os.path.abspath(files[0].path))):
        _place_locked(files)


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


def _place_locked(files: Sequence[AtomicFile]) -> None:
    journal_path = _hidden_name(files[0].path, _PAIR_MARK)
    entries: list[dict[str, Any]] = []
    placed: list[dict[str, Any]] = []
    try:
        for file in files:
            backup = None
            if os.path.lexists(file.path):
                backup = _hidden_name(file.path, _OLD_MARK)
                try:
                    os.link(file.path, backup)
                except OSError:
                    shutil.copy2(file.path, backup)
            target = os.path.abspath(file.path)
            entries.append({"target": target, "backup": backup, "new": _version(file.temp)})
        write_journal(journal_path, entries)
        for file, entry in zip(files, entries, strict=True):
            try:
                os.replace(file.temp, file.path)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, file.path) from None
            file.committed = True
            placed.append(entry)
            if len(placed) == 1:
                file_system.checkpoint("pair-first", file.path)
        fsync_dir(os.path.dirname(journal_path))
        os.unlink(journal_path)  # the commit point
    except BaseException:
        for entry in reversed(placed):
            with contextlib.suppress(OSError):
                _restore(entry)
        for entry in entries:
            if entry["backup"] is not None:
                with contextlib.suppress(OSError):
                    os.unlink(entry["backup"])
        with contextlib.suppress(OSError):
            os.unlink(journal_path)
        raise
    for entry in entries:
        if entry["backup"] is not None:
            with contextlib.suppress(OSError):
                os.unlink(entry["backup"])
    with contextlib.suppress(OSError):
        fsync_dir(os.path.dirname(journal_path))


def _belongs(entry: object, paths: Sequence[str]) -> bool:
    """A journal entry is acted on only for the very files being written now, with a backup
    named as :func:`place_together` names them beside its target: a journal naming other
    files (made by hand, or by someone else) never moves or removes anything."""
    if not isinstance(entry, dict) or not isinstance(entry.get("target"), str):
        return False
    target = entry["target"]
    if target not in {os.path.abspath(p) for p in paths}:
        return False
    backup = entry.get("backup")
    if backup is None:
        return isinstance(entry.get("new"), list)
    directory, name = os.path.split(target)
    prefix = temp_prefix(name).replace(TEMP_MARK, _OLD_MARK)
    return (
        isinstance(backup, str)
        and os.path.dirname(backup) == directory
        and os.path.basename(backup).startswith(prefix)
        and isinstance(entry.get("new"), list)
    )


#: The largest journal read: one holds a few paths and numbers per file of a pair.
_JOURNAL_LIMIT = 1 << 20


def recover_together(paths: Sequence[str]) -> None:
    """Finish what a killed :func:`place_together` of ``paths`` left: roll it back.

    A journal of a process that no longer exists means its files were not all placed:
    each one it placed is put back as it was (only while it still is the file that run
    wrote). Its backups and the journal are then removed; a run still going is left alone.
    """
    directory, first = os.path.split(os.path.abspath(paths[0]))
    prefix = temp_prefix(first).replace(TEMP_MARK, _PAIR_MARK)
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.startswith(prefix):
                continue
            pid = owner_pid(entry.name[len(prefix) :])
            if pid is None or pid == os.getpid() or pid_alive(pid):
                continue
            files = read_journal(entry.path, _JOURNAL_LIMIT)
            if files is None:
                continue  # not a journal this module writes: never read on, never removed
            for file in reversed(files if isinstance(files, list) else []):
                if _belongs(file, paths):
                    with contextlib.suppress(OSError, KeyError, TypeError):
                        _restore(file)
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    for path in paths:
        name = os.path.basename(path)
        parent = os.path.dirname(os.path.abspath(path))
        remove_stale(parent, temp_prefix(name).replace(TEMP_MARK, _OLD_MARK), directories=False)
        remove_stale(parent, temp_prefix(name), directories=False)
