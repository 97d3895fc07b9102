"""File-system helpers for atomic, durable output: temporaries beside the destination,
fsync, modes that follow the umask, and the final rename.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.storage.owners import owner_pid, pid_alive

if TYPE_CHECKING:
    from typing import Any, TypeAlias

    #: A path as the public functions take it: text, bytes (any name, non-UTF-8 too), or a
    #: path object of either; ``os.fsdecode`` makes it the ``str`` the library works with.
    #: (For annotations only: typing stays off the start-up path.)
    PathArg: TypeAlias = str | bytes | os.PathLike[str] | os.PathLike[bytes]

#: Marks every temporary mnist2db makes: ``.<name>.mnist2db-tmp-<pid>-<random>``.
TEMP_MARK = ".mnist2db-tmp-"


def temp_prefix(name: str) -> str:
    """``.<name>.mnist2db-tmp-`` for temporaries of the file or directory ``name``.

    A name too long to carry a suffix within the usual 255-byte limit is hashed.
    """
    if len(os.fsencode(name)) > 128:
        import hashlib  # rare: only for very long names; kept off the start-up path

        name = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return f".{name}{TEMP_MARK}"


def umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open()`` would give a new file: 0666 less the umask."""
    return 0o666 & ~umask()


def fsync_dir(path: str) -> None:
    """fsync a directory, so that a rename or a new entry in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every regular file directly in ``path``, then the directory itself."""
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)


def make_parents(directory: str) -> list[str]:
    """``os.makedirs(directory, exist_ok=True)``, returning the directories it created.

    The list runs from the outermost created directory to ``directory``: hand it to
    :func:`remove_made` to take them away again after a failure.

    Raises:
        OSError: as :func:`os.mkdir` (NotADirectoryError when a parent is a file).
    """
    missing: list[str] = []
    # Walked as written, not through os.path.abspath: "link/../new" is made where the kernel
    # resolves it (beside the link's target), not beside the link.
    path = directory.rstrip(os.sep) or directory
    while not os.path.lexists(path):
        missing.append(path)
        up = os.path.dirname(path)
        if not up or up == path:
            break
        path = up
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
    made: list[str] = []
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except FileExistsError:
                if not os.path.isdir(path):
                    raise
                continue  # made meanwhile by someone else: not ours to remove
            made.append(path)
    except BaseException:
        remove_made(made)
        raise
    return made


def check_made(made: list[str]) -> None:
    """Before writing inside directories :func:`make_parents` made: each still a directory,
    not a link put in its place since (which would carry what is written out of them).

    Raises:
        OSError: ``ELOOP``, naming the first that is not.
    """
    import stat

    for path in made:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = 0
        if not stat.S_ISDIR(mode):
            raise OSError(errno.ELOOP, "no longer the directory made there (a link?)", path)


def remove_made(made: list[str]) -> None:
    """Remove the directories :func:`make_parents` created, deepest first, if still empty."""
    for path in reversed(made):
        try:
            os.rmdir(path)
        except OSError:
            return  # not empty (someone else's now) or gone: leave it and its parents


def mkdtemp_beside(parent: str, prefix: str) -> str:
    """``tempfile.mkdtemp(prefix=prefix, dir=parent)`` (mode 0700) without tempfile's ~10 ms import."""
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return os.path.abspath(path)
    raise FileExistsError(errno.EEXIST, "no free temporary directory name", parent)


class AtomicFile:
    """A file written under a temporary name beside ``path``, moved there by :meth:`commit`.

    Use as a context manager: ``with AtomicFile(path) as target:`` creates the temporary
    on entering the block (not before: a signal between creating it and entering the block
    would leave it behind) and leaving the block without committing removes it, so a
    failure or an interruption never leaves a partial file under ``path``, nor a temporary
    beside it. Without a ``with``, call :meth:`create` where its clean-up (:meth:`discard`)
    is already guaranteed. Every OSError raised by :meth:`create`, :meth:`write`,
    :meth:`finish` and :meth:`commit` names ``path`` (``exc.filename``).

    The temporary goes into the directory the kernel will resolve ``path``'s into (through
    symbolic links and ``..``), so that the final rename never crosses a file system.
    """

    def __init__(self, path: str, suffix: str = "") -> None:
        self.path = path
        self.suffix = suffix
        self.temp = ""
        self.stream: Any = None
        self.committed = False
        self.finished = False

    def create(self) -> AtomicFile:
        """Create the temporary (once); returns ``self``. Interrupted half-way (a signal
        raising in the middle), it removes what it created before letting the signal on.

        Raises:
            OSError: the temporary cannot be created, naming ``path``.
        """
        if self.stream is not None:
            return self
        from mnist2db.interrupt import deferred

        directory = os.path.realpath(os.path.dirname(self.path) or os.curdir)
        prefix = temp_prefix(os.path.basename(self.path))
        # Temporaries of killed runs for this same file are recognised by name and removed.
        extensions = (self.suffix,) if self.suffix else ()
        remove_stale(directory, prefix, directories=False, extensions=extensions)
        try:
            with deferred():  # a signal meanwhile is raised once the clean-up below is armed
                for _ in range(100):
                    # The name is recorded before the file exists, so that whatever interrupts
                    # the creation, discard() knows what to remove: a name holding our pid and
                    # 48 random bits is no one else's.
                    self.temp = os.path.join(
                        directory, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}{self.suffix}"
                    )
                    try:
                        fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    except FileExistsError:
                        continue
                    self.stream = os.fdopen(fd, "wb")
                    break
                else:
                    self.temp = ""
                    raise FileExistsError(errno.EEXIST, "no free temporary name", directory)
        except OSError as exc:
            self.discard()
            raise OSError(exc.errno, exc.strerror, self.path) from None
        except BaseException:
            self.discard()
            raise
        return self

    def write(self, data: bytes | memoryview) -> None:
        """Write ``data``; a failure (a full disk, ``ulimit -f``) names ``path``."""
        try:
            self.stream.write(data)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None

    def finish(self) -> None:
        """Flush, fsync and close the temporary and give it the umask's mode (not yet moved)."""
        if self.finished:
            return
        try:
            self.stream.flush()
            os.fsync(self.stream.fileno())
            self.stream.close()
            os.chmod(self.temp, file_mode())
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None
        self.finished = True

    def commit(self, replace: bool = True) -> None:
        """:meth:`finish`, then rename the temporary to ``path`` and flush the directory;
        unless ``replace``, never over anything already there (FileExistsError naming it)."""
        self.finish()
        try:
            if replace:
                os.replace(self.temp, self.path)
            else:
                move_noreplace(self.temp, self.path)
            self.committed = True
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None

    def discard(self) -> None:
        """Close and remove the temporary unless committed (even if closing fails)."""
        try:
            # Closing flushes the buffer, which fails again on a full disk: the unlink
            # below must run all the same.
            if self.stream is not None:
                self.stream.close()
        except OSError:
            pass
        finally:
            if not self.committed and self.temp:
                with contextlib.suppress(OSError):
                    os.unlink(self.temp)

    def __enter__(self) -> AtomicFile:
        return self.create()

    def __exit__(self, *exc_info: object) -> None:
        self.discard()


def rmtree(path: str) -> None:
    """Remove a directory tree, ignoring errors (shutil is imported only when needed)."""
    import shutil  # ~5 ms of start-up, needed only when something is left to remove

    shutil.rmtree(path, ignore_errors=True)


def remove_stale(
    parent: str, prefix: str, *, directories: bool, extensions: tuple[str, ...] = ()
) -> list[str]:
    """Remove temporaries left in ``parent`` by processes that were killed.

    Only entries named ``<prefix><pid>-<random>[<extension>]`` (directories, or else regular
    files) whose process no longer exists are removed: a run still going keeps its own, and
    names we did not make are never touched. Returns the paths removed.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid = owner_pid(entry.name[len(prefix) :], extensions)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        if directories and entry.is_dir(follow_symlinks=False):
            rmtree(entry.path)
        elif not directories and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        else:
            continue
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    return removed


def read_journal(path: str, limit: int) -> object | None:
    """What a killed writer journalled at ``path`` (the JSON of files or databases being
    placed together); ``[]`` for a journal cut short (killed while writing it: nothing was
    placed yet); None for anything that is not a journal we write (a regular file of at
    most ``limit`` bytes): a FIFO of that name would hang the reader, a link to
    ``/dev/zero`` never end."""
    import json
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit:
        return None
    try:
        found: object = json.loads(data)
    except (ValueError, RecursionError):
        return []
    return found


def write_journal(path: str, entries: object) -> None:
    """Write a journal (JSON) to the new file ``path``, flushed with its directory entry,
    before the first of a set of files or databases is placed.

    Raises:
        OSError: it cannot be created (it exists) or written.
    """
    import json

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as journal:
        json.dump(entries, journal)
        journal.flush()
        os.fsync(journal.fileno())
    fsync_dir(os.path.dirname(path))


# -- the final rename: never over an existing name, or an atomic exchange -----------------------

#: renameat2(2)'s flags: fail if the target exists; exchange the two atomically.
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


def _renamed_at(src: str, dst: str, flags: int) -> bool:
    """True once renameat2 has done it; False where the OS or the file system lacks it.

    Raises:
        FileExistsError: ``dst`` exists (``_RENAME_NOREPLACE``).
        OSError: the rename failed otherwise.
    """
    if _renameat2 is None:
        return False
    try:
        _renameat2(src, dst, flags)
    except OSError as exc:
        if exc.errno == errno.EEXIST and flags == _RENAME_NOREPLACE:
            raise FileExistsError(errno.EEXIST, "exists", dst) from None
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
            raise
        return False
    return True


def move_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError if ``dst`` exists."""
    if _renamed_at(src, dst, _RENAME_NOREPLACE):
        return
    # No renameat2 (or the file system lacks it): check, then rename.
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    os.rename(src, dst)


def swap(src: str, dst: str) -> None:
    """Exchange ``src`` and ``dst`` atomically where the OS can; else move the old one aside."""
    if _renamed_at(src, dst, _RENAME_EXCHANGE):
        return
    aside = src + ".old"
    os.rename(dst, aside)
    try:
        os.rename(src, dst)
    except OSError:
        os.rename(aside, dst)
        raise
    os.rename(aside, src)


# -- the kill tests' hook ---------------------------------------------------------------------


def checkpoint(stage: str, staging: str) -> None:
    """A no-op called at fixed points of the staging life cycle, for the fault tests.

    The tests replace it (``mnist2db.storage.files.checkpoint``), in a child process, to
    pause there and kill the process; every caller calls it through this module, so the
    replacement is the one called. Stages: ``"staging"`` (the staging directory exists,
    nothing written yet), ``"staged"`` (the database is complete and flushed, about to be
    moved), ``"placed"`` (moved into place; ``staging`` now holds nothing, or the replaced
    database, still to be removed), ``"cleanup"`` (about to remove a staging directory that
    still exists). Files placed together
    (:func:`mnist2db.storage.file_placement.place_together`) add ``"pair-first"`` (the first
    file placed, the second not yet); databases placed together
    (:func:`mnist2db.storage.file_placement.place_all`) add ``"databases-first"`` (the
    first database placed).
    """
