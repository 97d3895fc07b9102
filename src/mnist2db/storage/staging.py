"""Staged databases and atomic placement: how every database writer puts its output in place.

A database is built in a hidden staging directory beside its destination
(``.<name>.mnist2db-tmp-<pid>-<random>``) and moved to its final name only once complete
and flushed, so a failed or killed run never leaves a partial database there. Where it may
go, and what an existing destination may be replaced with under ``overwrite``, is decided
before any work by :mod:`mnist2db.storage.targets`. A failed run removes its staging
directory and every parent directory it created.

:func:`staged_database` is the entry point for any writer (``convert``, the siamese-pair
writer, ...): ``with staged_database(out, "lmdb", overwrite=..., inputs=[...]) as staging:``
then write the database into ``staging`` with :func:`backends.open_writer`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from mnist2db.errors import (
    BackendError,
    OutputError,
    OutputExistsError,
)
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.storage.backends import check_backend
from mnist2db.storage.files import (
    fsync_dir,
    fsync_tree,
    make_parents,
    mkdtemp_beside,
    owner_pid,
    pid_alive,
    read_journal,
    remove_made,
    remove_stale,
    rmtree,
    temp_prefix,
    umask,
    write_journal,
)
from mnist2db.storage.targets import check_destination, is_owned_file

if TYPE_CHECKING:
    from typing import Any

#: Free space (bytes) below which a failed write is blamed on a full file system.
_LOW_SPACE = 1 << 20

_RENAME_NOREPLACE = 1


_RENAME_EXCHANGE = 2


def _load_renameat2() -> Callable[[str, str, int], None] | None:
    """renameat2(2) from libc, for moves that never replace (or that swap) atomically."""
    try:
        # The running program's own symbols include libc's; ctypes.util.find_library
        # would cost ~15 ms of start-up (it imports subprocess).
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    at_fdcwd = -100

    def renameat2(src: str, dst: str, flags: int) -> None:
        if func(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), dst)

    return renameat2


_renameat2 = _load_renameat2()


def move_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError if ``dst`` exists."""
    if _renameat2 is not None:
        try:
            _renameat2(src, dst, _RENAME_NOREPLACE)
            return
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise FileExistsError(errno.EEXIST, "exists", dst) from None
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                raise
    # No renameat2 (or the file system lacks it): check, then rename.
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    os.rename(src, dst)


def swap(src: str, dst: str) -> None:
    """Exchange ``src`` and ``dst`` atomically where the OS can; else move the old one aside."""
    if _renameat2 is not None:
        try:
            _renameat2(src, dst, _RENAME_EXCHANGE)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                raise
    aside = src + ".old"
    os.rename(dst, aside)
    try:
        os.rename(src, dst)
    except OSError:
        os.rename(aside, dst)
        raise
    os.rename(aside, src)


# -- staging and placement -----------------------------------------------------------------


def checkpoint(stage: str, staging: str) -> None:
    """A no-op called at fixed points of the staging life cycle, for the fault tests.

    The tests replace it, in a child process, to pause there and kill the process. Stages:
    ``"staging"`` (the staging directory exists, nothing written yet), ``"staged"`` (the
    database is complete and flushed, about to be moved), ``"placed"`` (moved into place;
    ``staging`` now holds nothing, or the replaced database, still to be removed),
    ``"cleanup"`` (about to remove a staging directory that still exists). Pairs of files
    (:func:`mnist2db.storage.placement.place_together`) add ``"pair-first"`` (the first file placed, the second
    not yet; see :mod:`mnist2db.storage.placement`); databases placed together
    (:func:`staged_databases`) add ``"databases-first"`` (the first database placed).
    """


def remove_stale_staging(out: str | os.PathLike[str]) -> list[str]:
    """Remove staging directories left beside ``out`` by conversions that were killed.

    Only directories named as :func:`staged_database` names its staging directories for
    this very destination (``.<name>.mnist2db-tmp-<pid>-<random>``) are touched, and only
    when the process ``<pid>`` no longer exists: a conversion still running keeps its own.
    Returns the paths removed.
    """
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    recover_databases(out)  # first: a killed pair's journal may name a staging directory
    prefix = temp_prefix(os.path.basename(os.path.normpath(out)))
    return remove_stale(parent, prefix, directories=True)


def stale_staging(out: str | os.PathLike[str]) -> list[str]:
    """The staging directories :func:`remove_stale_staging` would remove (named for ``out``,
    their process gone), oldest first: what a resumed conversion may adopt."""
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    prefix = temp_prefix(os.path.basename(os.path.normpath(out)))
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = owner_pid(entry.name[len(prefix) :])
            if pid is not None and pid != os.getpid() and not pid_alive(pid):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    return [path for _, path in sorted(found)]


def _explain_write_error(message: str, staging: str, out: str) -> str:
    """Name the destination rather than the staging directory, and say if space ran out.

    Backends report a full disk or an exceeded file size limit in their own words (LMDB
    often as an I/O error after a short write); the user should read the cause.
    """
    if message.startswith(staging + ": "):
        message = f"{out}: {message[len(staging) + 2 :]}"
    hints = []
    try:
        vfs = os.statvfs(staging)
        if vfs.f_bavail * vfs.f_frsize < _LOW_SPACE:
            hints.append(f"the file system holding {os.path.dirname(staging)} is full")
    except OSError:
        pass
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        with contextlib.suppress(OSError):
            if any(e.stat().st_size + _LOW_SPACE >= limit for e in os.scandir(staging)):
                hints.append(f"the file size limit (ulimit -f) of {limit} bytes was reached")
    return message + "".join(f" ({hint})" for hint in hints)


def _discard_replaced(old: str, backend: str, out: str) -> None:
    """Remove a replaced database, swapped out to ``old``: only the files ``backend`` makes.

    Anything else found there (put in after the check, before the swap) is kept: the
    directory is then renamed to a visible ``<name>.mnist2db-kept-<random>`` beside ``out``.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(old):
            if entry.is_file(follow_symlinks=False) and is_owned_file(backend, entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    try:
        os.rmdir(old)
    except FileNotFoundError:
        pass
    except OSError:
        kept = f"{os.path.normpath(out)}.mnist2db-kept-{os.urandom(4).hex()}"
        with contextlib.suppress(OSError):
            move_noreplace(old, kept)


def _make_parent(out: str, parent: str) -> list[str]:
    """Create ``out``'s missing parent directories; returns those created, deepest last."""
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise OutputExistsError(f"{out}: parent {os.path.dirname(out) or '.'} is not a directory")
    try:
        return make_parents(parent)
    except (NotADirectoryError, FileExistsError):
        raise OutputExistsError(f"{out}: a parent of it is not a directory") from None
    except OSError as exc:
        raise OutputError(f"{out}: cannot create its parent directory: {exc.strerror}") from None


@contextlib.contextmanager
def staged_database(
    out: str | os.PathLike[str],
    backend: str,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    on_checked: Callable[[], None] | None = None,
    adopt: str | None = None,
) -> Iterator[str]:
    """Yield a fresh staging directory for a ``backend`` database; on success move it to ``out``.

    ``adopt``: a staging directory of a killed run for ``out`` (:func:`stale_staging`) to
    continue instead: renamed for this process first, so that no other run reclaims it.

    Every check happens before the body runs: an existing ``out`` is refused unless
    ``overwrite`` and :func:`check_replaceable` allow it, and an input inside ``out`` is
    refused always. ``on_checked`` is called once they pass, before anything is made (a
    drop-in logs Caffe's "Opened" line there; what it raises leaves nothing behind). On any exception (KeyboardInterrupt included) the staging directory
    and the parent directories this call created are removed, and the destination is
    untouched. Staging directories of killed runs for the same destination are removed
    first (see :func:`remove_stale_staging`).

    Raises:
        OutputExistsError: the destination may not be written or replaced.
        BackendError: unknown backend, or the directory cannot be written or moved.
    """
    out = os.fspath(out)
    check_backend(backend)
    inputs = list(inputs)
    recover_databases(out)  # a killed pair's half is rolled back before ``out`` is judged
    check_destination(out, backend, overwrite, inputs)
    if on_checked is not None:
        on_checked()
    # As the kernel resolves it (through links and '..'), where the rename will put it.
    written = os.path.dirname(out.rstrip(os.sep) or out) or os.curdir
    made = _make_parent(out, written)
    parent = os.path.realpath(written)
    try:
        staging = _stage_and_place(out, parent, backend, overwrite, inputs, adopt)
        with staging as path:
            yield path
    except BaseException:
        remove_made(made)
        raise


@contextlib.contextmanager
def _stage_and_place(
    out: str,
    parent: str,
    backend: str,
    overwrite: bool,
    inputs: list[str | os.PathLike[str]],
    adopt: str | None = None,
) -> Iterator[str]:
    name = os.path.basename(os.path.normpath(out))
    prefix = f"{temp_prefix(name)}{os.getpid()}-"
    try:
        if adopt is not None:
            staging = os.path.join(parent, f"{prefix}{os.urandom(6).hex()}")
            os.rename(adopt, staging)
        remove_stale_staging(out)
        if adopt is None:
            staging = mkdtemp_beside(parent, prefix)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write in {parent}: {exc.strerror}") from None
    swapped = False
    try:
        try:
            # mkdtemp makes 0700; the finished database should follow the umask like mkdir.
            os.chmod(staging, 0o777 & ~umask())
        except OSError as exc:
            raise OutputError(f"{out}: cannot set permissions of {staging}: {exc}") from None
        checkpoint("staging", staging)
        try:
            yield staging
        except BackendError as exc:
            raise BackendError(_explain_write_error(str(exc), staging, out)) from exc
        try:
            fsync_tree(staging)
        except OSError as exc:
            raise OutputError(f"{out}: cannot flush the database to disk: {exc}") from None
        checkpoint("staged", staging)
        swapped = _place(staging, out, backend, overwrite, inputs)
        checkpoint("placed", staging)
    finally:
        if os.path.lexists(staging):
            checkpoint("cleanup", staging)
            if swapped:
                _discard_replaced(staging, backend, out)
            else:
                rmtree(staging)


def _place(
    staging: str, out: str, backend: str, overwrite: bool, inputs: list[str | os.PathLike[str]]
) -> bool:
    """Move ``staging`` to ``out``; True if an old database was swapped out into ``staging``."""
    parent = os.path.dirname(staging)
    swapped = False
    try:
        try:
            move_noreplace(staging, out)
        except FileExistsError:
            if not overwrite:
                raise OutputExistsError(
                    f"{out}: appeared while converting; left it alone "
                    "(use --overwrite to replace it)"
                ) from None
            check_destination(out, backend, overwrite, inputs)
            swap(staging, out)  # staging now holds the old database
            swapped = True
    except OSError as exc:
        raise OutputError(f"{out}: cannot move the finished database into place: {exc}") from None
    try:
        fsync_dir(parent)
    except OSError as exc:
        raise OutputError(f"{out}: moved into place, but cannot flush {parent}: {exc}") from None
    return swapped


# -- databases that appear together: an image database and its label database -------------

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


@contextlib.contextmanager
def staged_databases(
    outs: Sequence[str | os.PathLike[str]],
    backend: str,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
    on_checked: Callable[[], None] | None = None,
    adopt: Sequence[str | None] = (),
) -> Iterator[list[str]]:
    """:func:`staged_database` for databases that appear together or not at all (an image
    database and its label database): a staging directory for each of ``outs``, every check
    made before the body runs (``on_checked`` called once they pass), and on success all of
    them placed.

    Two renames are not one step, so a journal beside the first destination names every
    database and its staging directory before the first is placed, and is removed once all
    are (the commit point). A failure puts back what was placed (a replaced database
    swapped back); a kill leaves the journal, and the next writer of any of ``outs``
    (:func:`remove_stale_staging`, :func:`recover_databases`) rolls it back the same way.

    ``adopt``: for each of ``outs``, a staging directory of a killed run to continue (as
    :func:`staged_database`'s), or None for a fresh one.

    Raises:
        OutputExistsError: a destination may not be written or replaced, or two are one.
        BackendError, OutputError: as :func:`staged_database`.
    """
    names = [os.fspath(out) for out in outs]
    adopted = list(adopt) + [None] * (len(names) - len(adopt))
    if len(names) == 1:
        with staged_database(
            names[0],
            backend,
            overwrite=overwrite,
            inputs=inputs,
            on_checked=on_checked,
            adopt=adopted[0],
        ) as one:
            yield [one]
        return
    check_backend(backend)
    inputs = list(inputs)
    for out in names:
        recover_databases(out)  # a killed pair's half is rolled back before it is judged
    for i, out in enumerate(names):
        others: list[str | os.PathLike[str]] = [o for j, o in enumerate(names) if j != i]
        check_destination(out, backend, overwrite, inputs + others)
    if on_checked is not None:
        on_checked()
    made: list[str] = []
    stagings: list[str] = []
    swapped: list[bool] = []
    try:
        try:
            for out, old in zip(names, adopted, strict=True):
                written = os.path.dirname(out.rstrip(os.sep) or out) or os.curdir
                made += _make_parent(out, written)
                name = os.path.basename(os.path.normpath(out))
                prefix = f"{temp_prefix(name)}{os.getpid()}-"
                try:
                    if old is not None:  # renamed for this process first: no one reclaims it
                        staging = os.path.join(
                            os.path.realpath(written), f"{prefix}{os.urandom(6).hex()}"
                        )
                        os.rename(old, staging)
                        stagings.append(staging)
                    remove_stale_staging(out)
                    if old is None:
                        staging = mkdtemp_beside(os.path.realpath(written), prefix)
                        stagings.append(staging)
                    os.chmod(staging, 0o777 & ~umask())
                except OSError as exc:
                    raise OutputError(f"{out}: cannot stage it: {exc.strerror}") from None
            checkpoint("staging", stagings[0])
            try:
                yield list(stagings)
            except BackendError as exc:
                message = str(exc)
                for staging, out in zip(stagings, names, strict=True):
                    if message.startswith(staging + ": "):
                        message = _explain_write_error(message, staging, out)
                raise BackendError(message) from exc
            for staging, out in zip(stagings, names, strict=True):
                try:
                    fsync_tree(staging)
                except OSError as exc:
                    raise OutputError(f"{out}: cannot flush the database to disk: {exc}") from None
            checkpoint("staged", stagings[0])
            swapped = _place_together(stagings, names, backend, overwrite, inputs)
            checkpoint("placed", stagings[0])
        finally:
            for i, (staging, out) in enumerate(zip(stagings, names, strict=False)):
                if os.path.lexists(staging):
                    checkpoint("cleanup", staging)
                    if i < len(swapped) and swapped[i]:
                        _discard_replaced(staging, backend, out)
                    else:
                        rmtree(staging)
    except BaseException:
        remove_made(made)
        raise


def _journal_path(out: str) -> str:
    parent, name = os.path.split(os.path.abspath(out))
    prefix = temp_prefix(name).replace(".mnist2db-tmp-", _DBPAIR_MARK)
    return os.path.join(parent, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")


def _place_together(
    stagings: list[str], outs: list[str], backend: str, overwrite: bool, inputs: list[Any]
) -> list[bool]:
    """Place every staged database (journalled); which ones swapped an old one out."""

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
            swapped = _place(staging, out, backend, overwrite, inputs)
            entry["replaces"] = swapped
            placed.append(entry)
            if len(placed) == 1:
                checkpoint("databases-first", out)
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
    """Roll back databases that a killed :func:`staged_databases` placed only in part, when
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
    """A journal entry as :func:`_place_together` writes them, naming a staging directory
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
