"""Staged databases and atomic placement: the rules every database writer follows.

A database is built in a hidden staging directory beside its destination
(``.<name>.mnist2db-tmp-<pid>-<random>``) and moved to its final name only once complete
and flushed, so a failed or killed run never leaves a partial database there. What an
existing destination may be replaced with ``overwrite`` is decided here, once:

* only a directory that *is* a database of the backend being written: it opens as one,
  and every entry in it is a file that backend creates (:data:`backends.DATABASE_FILES`)
  or mnist2db's own metadata file (:data:`~mnist2db.storage.metadata.METADATA_NAME`);
  anything else is refused in one line naming the first foreign entry (an empty directory
  holds nothing to lose and is replaced too);
* never a symlink, a file, or a directory holding (or being) one of the inputs;
* a failed run removes its staging directory and every parent directory it created.

:func:`staged_database` is the entry point for any writer (``convert``, the siamese-pair
writer, ...): ``with staged_database(out, "lmdb", overwrite=..., inputs=[...]) as staging:``
then write the database into ``staging`` with :func:`backends.open_writer`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator

from mnist2db.errors import (
    ArgumentError,
    BackendError,
    Mnist2dbError,
    OutputError,
    OutputExistsError,
)
from mnist2db.storage.backends import BACKENDS, check_backend, is_database_file
from mnist2db.storage.files import (
    fsync_dir,
    fsync_tree,
    make_parents,
    mkdtemp_beside,
    remove_made,
    remove_stale,
    rmtree,
    temp_prefix,
    umask,
)
from mnist2db.storage.metadata import METADATA_NAME

#: Free space (bytes) below which a failed write is blamed on a full file system.
_LOW_SPACE = 1 << 20

_RENAME_NOREPLACE = 1

#: How messages name each backend's database ("… is an LMDB database").
_A_DATABASE = {"lmdb": "an LMDB", "leveldb": "a LevelDB"}


def is_owned_file(backend: str, name: str) -> bool:
    """True for a file a ``backend`` database directory may hold: the backend's, or ours."""
    return name == METADATA_NAME or is_database_file(backend, name)


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


# -- what may be replaced ------------------------------------------------------------------


def symlink_refusal(out: str) -> OutputExistsError:
    try:
        target = os.readlink(out)
    except OSError:
        target = "?"
    state = "" if os.path.exists(out) else ", which does not exist"
    return OutputExistsError(
        f"{out}: is a symbolic link (to {target}{state}); mnist2db never replaces a link, "
        "even with --overwrite: remove it or choose another name"
    )


def check_replaceable(out: str, backend: str) -> None:
    """Raise unless ``out`` is a directory ``overwrite`` may replace with a ``backend`` database.

    Raises:
        OutputExistsError: ``out`` is a symlink or not a directory, holds an entry that
            ``backend`` does not create (the first one, in name order, is named), or does
            not open as a ``backend`` database.
    """
    name = _A_DATABASE.get(backend, backend)
    if os.path.islink(out):
        raise symlink_refusal(out)
    if not os.path.isdir(out):
        raise OutputExistsError(
            f"{out}: exists and is not a database directory; refusing to replace it"
        )
    try:
        entries = sorted(os.scandir(out), key=lambda e: e.name)
    except OSError as exc:
        raise OutputExistsError(
            f"{out}: cannot list it to check it is a database: {exc.strerror}"
        ) from None
    if not entries:
        return  # an empty directory: nothing in it to lose
    _refuse_other_backend(out, backend, entries)
    for entry in entries:
        if not entry.is_file(follow_symlinks=False) or not is_owned_file(backend, entry.name):
            if entry.is_symlink():
                kind = "a symbolic link"
            elif entry.is_dir(follow_symlinks=False):
                kind = "a directory"
            elif entry.is_file(follow_symlinks=False):
                kind = "a file"
            else:
                kind = "a special file"
            raise OutputExistsError(
                f"{out}: holds {entry.name!r} ({kind}), which is not part of {name} "
                f"database; refusing to replace it (--overwrite replaces only {name} database)"
            )
    if not any(is_database_file(backend, entry.name) for entry in entries):
        raise OutputExistsError(
            f"{out}: holds only {METADATA_NAME}, not {name} database (its files are missing); "
            "refusing to replace it (remove it, or choose another name)"
        )
    from mnist2db.storage.readers import probe_database  # off the start-up path
    from mnist2db.storage.readhandles import held_elsewhere

    reason: str | None = probe_database(backend, out)
    if reason is not None and held_elsewhere(reason):
        raise OutputExistsError(
            f"{out}: is {name} database another process has open ({reason}); refusing to "
            "replace it while it is in use"
        )
    if reason is not None:
        raise OutputExistsError(
            f"{out}: does not open as {name} database ({reason}); refusing to replace it"
        )


def _refuse_other_backend(out: str, backend: str, entries: list[os.DirEntry[str]]) -> None:
    """A directory that is a database of another backend is named as one: the user most
    likely meant that backend (a wrong ``--backend``), not that it holds foreign files."""
    for other in BACKENDS:
        if other == backend:
            continue
        files = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        if (
            len(files) == len(entries)
            and any(is_database_file(other, f) for f in files)
            and all(is_owned_file(other, f) for f in files)
        ):
            raise OutputExistsError(
                f"{out}: it is {_A_DATABASE[other]} database (use --backend {other}, or "
                f"remove it); --overwrite replaces only {_A_DATABASE[backend]} database"
            )


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _lineage(path: str) -> list[tuple[int, int]]:
    """The identities (device, inode) of every existing directory holding ``path``, as the
    kernel resolves it (symbolic links followed; a bind mount has the identities of what
    it mounts), nearest first; ``path`` itself is not included."""
    found: list[tuple[int, int]] = []
    current = os.path.realpath(path)
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            return found
        current = parent
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(current)
            if stat.S_ISDIR(st.st_mode):
                found.append((st.st_dev, st.st_ino))


def check_apart(
    out: str, inputs: Iterable[str | os.PathLike[str]], *, database: bool = False
) -> None:
    """The one rule that keeps every output off the inputs of the same run.

    Refused, before any work: ``out`` *is* an input (the same file, through any name: a
    hard link, a symbolic link, a bind mount), ``out`` lies inside an input directory (a
    file written into a database being read), or an input lies inside ``out`` (a database
    directory being replaced, ``database``: an input in it, or a hard link to one of its
    files). Inputs are the files and database directories the run reads; one that does
    not exist is not checked (the run fails on it anyway).

    Raises:
        OutputExistsError: naming the output and the input.
    """
    out_identity = _identity(out)
    above_out = _lineage(out)
    inside: set[tuple[int, int]] = set()
    if database and out_identity is not None and os.path.isdir(out):
        with contextlib.suppress(OSError):
            for entry in os.scandir(out):
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    inside.add((st.st_dev, st.st_ino))
    for source in inputs:
        path = os.fspath(source)
        identity = _identity(path)
        if identity is None:
            continue
        if (
            database
            and out_identity is not None
            and (identity == out_identity or identity in inside or out_identity in _lineage(path))
        ):
            raise OutputExistsError(
                f"{out}: holds the input {path}; refusing to replace it "
                "(write the database somewhere else)"
            )
        if identity == out_identity and os.path.isdir(out):
            raise OutputExistsError(
                f"{out}: is the input {path}; refusing to write into it (write it somewhere else)"
            )
        if identity == out_identity:
            raise OutputExistsError(f"{out}: is the input {path}; refusing to replace it")
        if identity in above_out:
            raise OutputExistsError(
                f"{out}: is inside the input {path}; refusing to write there "
                "(write it somewhere else)"
            )


def check_parent(out: str, *, makes_parents: bool) -> None:
    """Refuse, before any work, an output whose directory will not be there at the end.

    The directory is taken as written, as the kernel will resolve it: ``nodir/../db`` needs
    ``nodir``, whatever ``os.path.abspath`` makes of it. A missing directory is refused
    unless the caller creates it (``makes_parents``), and then only when no ``..`` follows
    the missing part (creating ``nodir`` just to leave it again is not what was meant).

    Raises:
        Mnist2dbError: the directory does not exist (and will not be created), or cannot be.
        OutputExistsError: a parent of ``out`` is not a directory.
    """
    parent = os.path.dirname(out.rstrip(os.sep) or out)
    if not parent or os.path.isdir(parent):
        return
    parts = parent.split(os.sep)
    missing, end = None, 0
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end]) or os.sep
        if not os.path.exists(prefix):
            missing = prefix
            break
        if not os.path.isdir(prefix):
            raise OutputExistsError(f"{out}: parent {prefix} is not a directory")
    if not makes_parents:
        raise Mnist2dbError(f"{out}: no directory {parent} to write it in")
    if missing is not None and os.pardir in parts[end:]:
        raise Mnist2dbError(
            f"{out}: no directory {parent} to write it in ({missing} does not exist, and "
            "'..' after it would leave it again: create it first, or name the path without '..')"
        )


def _check_destination(
    out: str, backend: str, overwrite: bool, inputs: Iterable[str | os.PathLike[str]]
) -> None:
    if not out:
        raise ArgumentError("the destination path is empty: name a directory to create")
    # "db/" names what "db" names, but would follow a link and hide a file: check "db".
    bare = out.rstrip(os.sep) or out
    check_apart(bare, inputs, database=True)
    check_parent(bare, makes_parents=True)
    if os.path.lexists(bare):
        if os.path.islink(bare):
            raise symlink_refusal(bare)
        if not overwrite:
            raise OutputExistsError(f"{out}: already exists (use --overwrite to replace it)")
        here = os.path.realpath(os.curdir)
        real = os.path.realpath(bare)
        if here == real or here.startswith(real.rstrip(os.sep) + os.sep):
            raise OutputExistsError(
                f"{out}: is the current directory or holds it; refusing to replace it"
            )
        check_replaceable(bare, backend)


# -- staging and placement -----------------------------------------------------------------


def checkpoint(stage: str, staging: str) -> None:
    """A no-op called at fixed points of the staging life cycle, for the fault tests.

    The tests replace it, in a child process, to pause there and kill the process. Stages:
    ``"staging"`` (the staging directory exists, nothing written yet), ``"staged"`` (the
    database is complete and flushed, about to be moved), ``"placed"`` (moved into place;
    ``staging`` now holds nothing, or the replaced database, still to be removed),
    ``"cleanup"`` (about to remove a staging directory that still exists). Pairs of files
    (:func:`mnist2db.storage.placement.place_together`) add ``"pair-first"`` (the first file placed, the second
    not yet; see :mod:`mnist2db.storage.placement`).
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
    prefix = temp_prefix(os.path.basename(os.path.normpath(out)))
    return remove_stale(parent, prefix, directories=True)


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
) -> Iterator[str]:
    """Yield a fresh staging directory for a ``backend`` database; on success move it to ``out``.

    Every check happens before the body runs: an existing ``out`` is refused unless
    ``overwrite`` and :func:`check_replaceable` allow it, and an input inside ``out`` is
    refused always. On any exception (KeyboardInterrupt included) the staging directory
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
    _check_destination(out, backend, overwrite, inputs)
    # As the kernel resolves it (through links and '..'), where the rename will put it.
    written = os.path.dirname(out.rstrip(os.sep) or out) or os.curdir
    made = _make_parent(out, written)
    parent = os.path.realpath(written)
    try:
        staging = _stage_and_place(out, parent, backend, overwrite, inputs)
        with staging as path:
            yield path
    except BaseException:
        remove_made(made)
        raise


@contextlib.contextmanager
def _stage_and_place(
    out: str, parent: str, backend: str, overwrite: bool, inputs: list[str | os.PathLike[str]]
) -> Iterator[str]:
    name = os.path.basename(os.path.normpath(out))
    remove_stale_staging(out)
    try:
        staging = mkdtemp_beside(parent, f"{temp_prefix(name)}{os.getpid()}-")
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
            _check_destination(out, backend, overwrite, inputs)
            swap(staging, out)  # staging now holds the old database
            swapped = True
    except OSError as exc:
        raise OutputError(f"{out}: cannot move the finished database into place: {exc}") from None
    try:
        fsync_dir(parent)
    except OSError as exc:
        raise OutputError(f"{out}: moved into place, but cannot flush {parent}: {exc}") from None
    return swapped
