"""Where an output may go, decided before any work: the rules every writer follows.

* An output never lands on an input: not on an input file or database, not inside one,
  not on a directory holding one (:func:`check_apart`, for databases and single files).
* Its parent is a directory, or can be made one (:func:`check_parent`).
* What an existing destination may be replaced with ``overwrite``: only a directory that
  *is* a database of the backend being written (it opens as one, and every entry in it is
  a file that backend creates or mnist2db's own metadata file); anything else is refused in
  one line naming the first foreign entry (an empty directory holds nothing to lose);
  never a symbolic link, the current directory, or a directory that holds it
  (:func:`check_destination`, :func:`check_replaceable`).

:mod:`mnist2db.storage.db_staging` (databases) and :mod:`mnist2db.storage.file_placement` (files)
call these; nothing else decides where an output may go.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable

from mnist2db.errors import (
    ArgumentError,
    Mnist2dbError,
    OutputError,
    OutputExistsError,
)
from mnist2db.storage.databases.backends import BACKEND, BACKENDS, METADATA_NAME, is_database_file


def is_owned_file(backend: str, name: str) -> bool:
    """True for a file a ``backend`` database directory may hold: the backend's, or ours."""
    return name == METADATA_NAME or is_database_file(backend, name)


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
    name = BACKEND[backend].article if backend in BACKEND else backend
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
    from mnist2db.storage.databases.handles import held_elsewhere
    from mnist2db.storage.databases.readers import probe_database  # off the start-up path

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
                f"{out}: it is {BACKEND[other].article} database (use --backend {other}, or "
                f"remove it); --overwrite replaces only {BACKEND[backend].article} database"
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


def _check_name_lengths(out: str, parent: str) -> None:
    """A name longer than the file system takes fails only when it is created, the work
    done (a database is moved to its name last): refuse it first."""
    directory = parent or os.curdir
    while not os.path.isdir(directory):
        up = os.path.dirname(directory) or os.curdir
        if up == directory:
            break
        directory = up
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for name in (out.rstrip(os.sep) or out).split(os.sep):
        size = len(os.fsencode(name))
        if size > limit:
            raise OutputError(
                f"{out}: the name {name[:16]}… is {size} bytes long; the file system takes "
                f"names of at most {limit} bytes"
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
    _check_name_lengths(out, parent)
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


def check_destination(
    out: str, backend: str, overwrite: bool, inputs: Iterable[str | os.PathLike[str]]
) -> None:
    if not out:
        raise ArgumentError("the destination path is empty: name a directory to create")
    if check_directory_target(out, overwrite, inputs):
        check_replaceable(out.rstrip(os.sep) or out, backend)


def check_directory_target(
    out: str, overwrite: bool, inputs: Iterable[str | os.PathLike[str]]
) -> bool:
    """The checks of every directory an output replaces as a whole (a database, an export's
    tree): apart from the inputs, a parent to write in; when it exists, not a link,
    ``overwrite`` given, not the current directory nor holding it. Returns whether it
    exists (the caller then checks that it is of the kind it replaces).

    Raises:
        OutputExistsError: naming ``out`` and what forbids replacing it.
    """
    # "db/" names what "db" names, but would follow a link and hide a file: check "db".
    bare = out.rstrip(os.sep) or out
    check_apart(bare, inputs, database=True)
    check_parent(bare, makes_parents=True)
    if not os.path.lexists(bare):
        return False
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
    return True


#: The suffix of a label database's name: ``OUT`` and ``OUT_labels``
#: (:mod:`mnist2db.labels.databases`).
LABELS_SUFFIX = "_labels"


def labels_path(out: str | os.PathLike[str]) -> str:
    """Where the label database of the image database ``out`` goes: ``OUT_labels``."""
    return os.path.normpath(os.fspath(out)) + LABELS_SUFFIX
