"""Staged databases and atomic placement: how every database writer puts its output in place.

A database is built in a hidden staging directory beside its destination
(``.<name>.mnist2db-tmp-<pid>-<random>``) and moved to its final name only once complete
and flushed, so a failed or killed run never leaves a partial database there. Where it may
go, and what an existing destination may be replaced with under ``overwrite``, is decided
before any work by :mod:`mnist2db.storage.destinations`. A failed run removes its staging
directory and every parent directory it created.

:func:`staged_database` is the entry point for any writer (``convert``, the siamese-pair
writer, ...): ``with staged_database(out, "lmdb", overwrite=..., inputs=[...]) as staging:``
then write the database into ``staging`` with :func:`backends.open_writer`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from mnist2db.errors import (
    BackendError,
    OutputError,
    OutputExistsError,
)
from mnist2db.storage import files
from mnist2db.storage.databases.backends import check_backend
from mnist2db.storage.destinations import check_destination, is_owned_file
from mnist2db.storage.file_placement import place_all, recover_together
from mnist2db.storage.files import (
    fsync_dir,
    fsync_tree,
    make_parents,
    mkdtemp_beside,
    move_noreplace,
    remove_made,
    remove_stale,
    rmtree,
    swap,
    temp_prefix,
    umask,
)
from mnist2db.storage.owners import owner_pid, pid_alive

#: Free space (bytes) below which a failed write is blamed on a full file system.
_LOW_SPACE = 1 << 20


def remove_stale_staging(out: str | os.PathLike[str]) -> list[str]:
    """Remove staging directories left beside ``out`` by conversions that were killed.

    Only directories named as :func:`staged_database` names its staging directories for
    this very destination (``.<name>.mnist2db-tmp-<pid>-<random>``) are touched, and only
    when the process ``<pid>`` no longer exists: a conversion still running keeps its own.
    Returns the paths removed.
    """
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    recover_together([out])  # first: a killed pair's journal may name a staging directory
    prefix = temp_prefix(os.path.basename(os.path.normpath(out)))
    return remove_stale(parent, prefix, directories=True)


def stale_staging(
    out: str | os.PathLike[str], started: Callable[[str, int], int | None] | None = None
) -> list[str]:
    """The staging directories :func:`remove_stale_staging` would remove (named for ``out``,
    their process gone), oldest first: what a resumed conversion may adopt. ``started(path,
    pid)``: the start time process ``pid`` recorded in the directory as its owner (None:
    none), which a live process of that pid must have to be it
    (:func:`~mnist2db.storage.owners.pid_alive`)."""
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    prefix = temp_prefix(os.path.basename(os.path.normpath(out)))
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = owner_pid(entry.name[len(prefix) :])
            recorded = None if started is None or pid is None else started(entry.path, pid)
            if pid is not None and pid != os.getpid() and not pid_alive(pid, recorded):
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
    recover_together([out])  # a killed pair's half is rolled back before ``out`` is judged
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
        files.checkpoint("staging", staging)
        try:
            yield staging
        except BackendError as exc:
            raise BackendError(_explain_write_error(str(exc), staging, out)) from exc
        try:
            fsync_tree(staging)
        except OSError as exc:
            raise OutputError(f"{out}: cannot flush the database to disk: {exc}") from None
        files.checkpoint("staged", staging)
        swapped = _place(staging, out, backend, overwrite, inputs)
        files.checkpoint("placed", staging)
    finally:
        if os.path.lexists(staging):
            files.checkpoint("cleanup", staging)
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

    They are placed under a journal (:func:`mnist2db.storage.file_placement.place_all`):
    a failure puts back what was placed (a replaced database swapped back); a kill leaves
    the journal, and the next writer of any of ``outs`` (:func:`remove_stale_staging`,
    :func:`~mnist2db.storage.file_placement.recover_together`) rolls it back the same way.

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
        recover_together([out])  # a killed pair's half is rolled back before it is judged
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
            files.checkpoint("staging", stagings[0])
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
            files.checkpoint("staged", stagings[0])
            swapped = place_all(
                stagings,
                names,
                lambda staging, out: _place(staging, out, backend, overwrite, inputs),
                checkpoint="databases-first",
            )
            files.checkpoint("placed", stagings[0])
        finally:
            for i, (staging, out) in enumerate(zip(stagings, names, strict=False)):
                if os.path.lexists(staging):
                    files.checkpoint("cleanup", staging)
                    if i < len(swapped) and swapped[i]:
                        _discard_replaced(staging, backend, out)
                    else:
                        rmtree(staging)
    except BaseException:
        remove_made(made)
        raise
