"""An export's output directory: staged beside it, renamed into place, replaced only when ours.

The tree is written in a hidden staging directory beside ``OUT``
(``.<name>.mnist2db-tmp-<pid>-<random>``, as databases are staged), flushed, and renamed to
``OUT`` only when complete: a failure, a full disk or a kill leaves nothing under ``OUT``
(a killed run's staging directory is removed by the next export to the same ``OUT``).
``--overwrite`` replaces an existing ``OUT`` only when it can be proved to be an export's:
it holds :data:`MARKER` and exactly the files and bytes the marker counts, nothing else
(no link, no special file, no file added since).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
from collections.abc import Iterator
from typing import Any

from mnist2db.errors import ArgumentError, OutputError, OutputExistsError
from mnist2db.storage.destinations import check_directory_target
from mnist2db.storage.files import (
    check_made,
    fsync_dir,
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

#: The file that marks a directory as an export's, and counts what it holds.
MARKER = "export.json"
MARKER_FORMAT = "mnist2db export"
_MARKER_LIMIT = 1 << 20


def _syncfs(path: str) -> None:
    """Flush the file system holding ``path`` (every file of the tree in one call: an fsync
    per image would cost more than writing it); ``os.sync`` where syncfs is missing."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) == 0:
                return
        except (OSError, AttributeError):
            pass
        os.sync()
    finally:
        os.close(fd)


def read_marker(out: str) -> dict[str, Any] | None:
    """``out``'s marker, when it is a regular file holding an export's marker; else None.
    Read never through a link, nor from anything but a regular file (a FIFO would hang)."""
    path = os.path.join(out, MARKER)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MARKER_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        found = json.loads(data) if len(data) <= _MARKER_LIMIT else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or found.get("format") != MARKER_FORMAT:
        return None
    return found


#: The counts a marker holds (whole numbers), beside its files and bytes.
_MARKER_COUNTS = ("records", "restored", "shared", "named", "mapped", "encoded", "raw",
                  "files", "bytes")  # fmt: skip


def marker_problem(marker: dict[str, Any]) -> str | None:
    """What is not as mnist2db writes it in an export's marker (read back: a stranger's
    input), the field named; None when every field is."""

    def shown(value: Any) -> str:
        try:
            return json.dumps(value, allow_nan=False)[:60]
        except (ValueError, TypeError, RecursionError):
            return type(value).__name__

    if marker.get("version") != 1 or type(marker.get("version")) is not int:
        return f"version: {shown(marker.get('version'))}, expected 1"
    if marker.get("to") != "files":
        return f'to: {shown(marker.get("to"))}, expected "files"'
    for name in ("source", "label_db"):
        if (name in marker or name == "source") and type(marker.get(name)) is not str:
            return f"{name}: {shown(marker.get(name))}, expected a string"
    for name in _MARKER_COUNTS:
        value = marker.get(name)
        if type(value) is not int or not 0 <= value < 1 << 63:
            return f"{name}: {shown(value)}, expected a whole number"
    return None


def not_ours(out: str) -> str | None:
    """None when ``out`` holds exactly what its marker counts; else what is wrong."""
    marker = read_marker(out)
    if marker is None:
        return f"holds no {MARKER} of an export"
    problem = marker_problem(marker)
    if problem is not None:
        return f"its {MARKER} is not as mnist2db writes it ({problem})"
    files = size = 0
    for folder, subfolders, names in os.walk(out):
        for name in subfolders + names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                return f"holds {os.path.relpath(path, out)!r}, which is not a regular file"
            if folder == out and name == MARKER:
                continue
            files += 1
            size += info.st_size
    if (files, size) != (marker["files"], marker["bytes"]):
        return (
            f"holds {files} files of {size} bytes, its {MARKER} counts {marker['files']} "
            f"of {marker['bytes']} (files added or changed since)"
        )
    return None


def check_out_dir(out: str, inputs: list[str], overwrite: bool) -> None:
    """Refuse, before any work, an ``out`` that may not be written or replaced.

    Raises:
        ArgumentError: ``out`` is empty.
        OutputExistsError: ``out`` is, holds or lies inside an input; is a link; exists and
            ``overwrite`` is false, or is not an export's (:func:`not_ours`).
    """
    if not out:
        raise ArgumentError("the output directory is empty: name a directory to create")
    if not check_directory_target(out, overwrite, inputs):
        return
    bare = out.rstrip(os.sep) or out
    if not os.path.isdir(bare):
        raise OutputExistsError(f"{out}: exists and is not a directory; refusing to replace it")
    reason = not_ours(bare)
    if reason is not None:
        raise OutputExistsError(
            f"{out}: {reason}; refusing to replace it (--overwrite replaces only an export)"
        )


@contextlib.contextmanager
def staged_tree(out: str, inputs: list[str], overwrite: bool) -> Iterator[str]:
    """Yield a fresh staging directory; when the body returns, flush it and put it at ``out``.

    On any exception (interruptions included) the staging directory and the parents this
    call made are removed; ``out`` is untouched.
    """
    check_out_dir(out, inputs, overwrite)
    bare = out.rstrip(os.sep) or out
    written = os.path.dirname(bare) or os.curdir
    name = os.path.basename(os.path.normpath(bare))
    try:
        made = make_parents(written)
    except OSError as exc:
        raise OutputError(f"{out}: cannot create its parent directory: {exc.strerror}") from None
    staging = ""
    try:
        try:
            check_made(made)  # the staging directory goes inside them, never through a link
        except OSError as exc:
            raise OutputError(f"{exc.filename}: cannot write in it: {exc.strerror}") from None
        parent = os.path.realpath(written)
        prefix = temp_prefix(name)
        remove_stale(parent, prefix, directories=True)
        try:
            staging = mkdtemp_beside(parent, f"{prefix}{os.getpid()}-")
            os.chmod(staging, 0o777 & ~umask())
        except OSError as exc:
            raise OutputError(f"{out}: cannot write in {parent}: {exc.strerror}") from None
        yield staging
        try:
            _syncfs(staging)
            check_made(made)
            try:
                move_noreplace(staging, bare)
            except FileExistsError:
                check_out_dir(out, inputs, overwrite)  # appeared meanwhile, or changed
                swap(staging, bare)  # staging now holds the old export
            fsync_dir(parent)
        except OSError as exc:
            raise OutputError(f"{out}: cannot move the finished export into place: {exc}") from None
    except BaseException:
        if staging and os.path.lexists(staging):
            rmtree(staging)
        remove_made(made)
        raise
    if os.path.lexists(staging):
        rmtree(staging)  # the export it replaced
