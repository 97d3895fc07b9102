"""The one conversion pipeline: IDX images + labels -> Caffe Datum records -> LMDB or LevelDB.

Every front end (``mnist2db convert``, ``convert_mnist_data``, the Python API) calls
:func:`convert`. Records are streamed a batch at a time: memory is bounded by the batch, not
by the dataset. The database is built in a staging directory beside the destination and
moved into place only once it is complete and flushed to disk, so a failed or killed
conversion never leaves a partial database under the final name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import time
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence

from .backends import BACKENDS, detect_backend, open_writer
from .datum import datum_prefix, encode_raw_batch, splitter
from .errors import BackendError, IdxFormatError, Mnist2dbError, OutputExistsError
from .fsutil import (
    TEMP_MARK,
    fsync_dir,
    fsync_tree,
    mkdtemp_beside,
    remove_stale,
    rmtree,
    temp_prefix,
    umask,
)
from .idx import IdxHeader, open_idx

__all__ = ["ConvertResult", "convert", "check_pair", "remove_stale_staging"]

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
DEFAULT_BATCH_SIZE = 1000
_INT32_MAX = (1 << 31) - 1
# Keys are "%08d" as in Caffe; past 10**8 records they grow a digit and stop sorting in
# index order, so LMDB's append mode is only used below that.
_APPEND_LIMIT = 10**8

#: Marker in the names of staging directories, so left-overs are recognisable.
STAGING_MARK = TEMP_MARK
#: Free space (bytes) below which a failed write is blamed on a full file system.
_LOW_SPACE = 1 << 20

ProgressCallback = Callable[[int, int], None]

TYPE_CHECKING = False  # not typing's: see mnist2db/__init__.py
if TYPE_CHECKING:
    from typing import NamedTuple

    class _ConvertResultFields(NamedTuple):
        path: str
        backend: str
        count: int  # type: ignore[assignment]  # the field hides tuple.count
        rows: int
        cols: int
        seconds: float

else:
    # A named tuple rather than a dataclass: importing dataclasses costs ~15 ms of start-up.
    _ConvertResultFields = namedtuple(
        "_ConvertResultFields", "path backend count rows cols seconds"
    )


class ConvertResult(_ConvertResultFields):
    """What :func:`convert` wrote (immutable).

    Fields: ``path``, ``backend``, ``count``, ``rows``, ``cols``, ``seconds``.
    """

    __slots__ = ()

    def summary(self) -> str:
        """What Caffe's convert_mnist_data logs, then where the database went and how fast."""
        return (
            f"A total of {self.count} items.\n"
            f"Rows: {self.rows} Cols: {self.cols}\n"
            f"Processed {self.count} files.\n"
            f"Wrote {self.path} ({self.backend}) in {self.seconds:.2f} s."
        )


def check_pair(images: IdxHeader, labels: IdxHeader) -> None:
    """Check that two IDX headers are an MNIST image file and its label file.

    Raises:
        IdxFormatError: wrong magic (with a hint when the two were swapped), or the item
            counts differ, or image dimensions that a Datum cannot hold.
    """
    if images.magic != IMAGES_MAGIC:
        hint = (
            " (is it the label file? the image file comes first)"
            if images.magic == LABELS_MAGIC
            else ""
        )
        raise IdxFormatError(
            f"{images.path}: magic 0x{images.magic:08x}, expected 0x{IMAGES_MAGIC:08x} "
            f"(uint8 images, 3 dimensions){hint}"
        )
    if labels.magic != LABELS_MAGIC:
        hint = (
            " (is it the image file? the label file comes second)"
            if labels.magic == IMAGES_MAGIC
            else ""
        )
        raise IdxFormatError(
            f"{labels.path}: magic 0x{labels.magic:08x}, expected 0x{LABELS_MAGIC:08x} "
            f"(uint8 labels, 1 dimension){hint}"
        )
    if images.count != labels.count:
        raise IdxFormatError(
            f"{images.path}: {images.count} images, but {labels.path} has {labels.count} labels"
        )
    rows, cols = images.dims[1], images.dims[2]
    if rows > _INT32_MAX or cols > _INT32_MAX:
        # Datum's height and width are int32 (found by tests/test_fuzz.py: 2**31 × 0 images).
        raise IdxFormatError(
            f"{images.path}: images of {rows} × {cols} pixels do not fit a Datum "
            f"(height and width at most {_INT32_MAX})"
        )
    if rows * cols > _INT32_MAX:
        raise IdxFormatError(
            f"{images.path}: images of {rows} × {cols} pixels are too large for a Datum "
            f"(at most {_INT32_MAX} bytes)"
        )


# -- staging and atomic placement ---------------------------------------------------------

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


def _move_noreplace(src: str, dst: str) -> None:
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


def _swap(src: str, dst: str) -> None:
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


def _check_destination(out: str, overwrite: bool) -> str:
    """Validate the destination; returns its parent directory (created if missing)."""
    if os.path.lexists(out):
        if not overwrite:
            raise OutputExistsError(f"{out}: already exists (use --overwrite to replace it)")
        if not os.path.isdir(out) or os.path.islink(out):
            raise OutputExistsError(
                f"{out}: exists and is not a database directory; refusing to replace it"
            )
        if os.listdir(out):
            try:
                detect_backend(out)
            except BackendError:
                raise OutputExistsError(
                    f"{out}: exists and is not an LMDB or LevelDB database; refusing to replace it"
                ) from None
    parent = os.path.dirname(os.path.abspath(out))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise OutputExistsError(f"{out}: parent {os.path.dirname(out) or '.'} is not a directory")
    try:
        os.makedirs(parent, exist_ok=True)
    except NotADirectoryError:
        raise OutputExistsError(f"{out}: a parent of it is not a directory") from None
    except OSError as exc:
        raise BackendError(f"{out}: cannot create its parent directory: {exc.strerror}") from None
    return parent


def _checkpoint(stage: str, staging: str) -> None:
    """A no-op called at fixed points of the staging life cycle, for the fault tests.

    The tests replace it, in a child process, to pause there and kill the process. Stages:
    ``"staging"`` (the staging directory exists, nothing written yet), ``"staged"`` (the
    database is complete and flushed, about to be moved), ``"placed"`` (moved into place;
    ``staging`` now holds nothing, or the replaced database, still to be removed),
    ``"cleanup"`` (about to remove a staging directory that still exists).
    """


def _staging_prefix(name: str) -> str:
    return temp_prefix(name)


def remove_stale_staging(out: str | os.PathLike[str]) -> list[str]:
    """Remove staging directories left beside ``out`` by conversions that were killed.

    Only directories named as :func:`convert` names its staging directories for this very
    destination (``.<name>.mnist2db-tmp-<pid>-<random>``) are touched, and only when the
    process ``<pid>`` no longer exists: a conversion still running keeps its own. Returns
    the paths removed.
    """
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    prefix = _staging_prefix(os.path.basename(os.path.normpath(out)))
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


@contextlib.contextmanager
def _staged_directory(out: str, overwrite: bool) -> Iterator[str]:
    """Yield a fresh staging directory beside ``out``; on success move it to ``out``.

    On any exception (KeyboardInterrupt included) the staging directory is removed and the
    destination is untouched. Staging directories of killed runs for the same destination
    are removed first (see :func:`remove_stale_staging`).
    """
    parent = _check_destination(out, overwrite)
    name = os.path.basename(os.path.normpath(out))
    remove_stale_staging(out)
    try:
        staging = mkdtemp_beside(parent, f"{_staging_prefix(name)}{os.getpid()}-")
    except OSError as exc:
        raise BackendError(f"{out}: cannot write in {parent}: {exc.strerror}") from None
    try:
        try:
            # mkdtemp makes 0700; the finished database should follow the umask like mkdir.
            os.chmod(staging, 0o777 & ~umask())
        except OSError as exc:
            raise BackendError(f"{out}: cannot set permissions of {staging}: {exc}") from None
        _checkpoint("staging", staging)
        try:
            yield staging
        except BackendError as exc:
            raise BackendError(_explain_write_error(str(exc), staging, out)) from exc
        try:
            fsync_tree(staging)
        except OSError as exc:
            raise BackendError(f"{out}: cannot flush the database to disk: {exc}") from None
        _checkpoint("staged", staging)
        _place(staging, out, overwrite)
        _checkpoint("placed", staging)
    finally:
        if os.path.lexists(staging):
            _checkpoint("cleanup", staging)
            rmtree(staging)


def _place(staging: str, out: str, overwrite: bool) -> None:
    parent = os.path.dirname(staging)
    try:
        try:
            _move_noreplace(staging, out)
        except FileExistsError:
            if not overwrite:
                raise OutputExistsError(
                    f"{out}: appeared while converting; left it alone "
                    "(use --overwrite to replace it)"
                ) from None
            _check_destination(out, overwrite)
            _swap(staging, out)  # staging now holds the old database and is removed by the caller
    except OSError as exc:
        raise BackendError(f"{out}: cannot move the finished database into place: {exc}") from None
    try:
        fsync_dir(parent)
    except OSError as exc:
        raise BackendError(f"{out}: moved into place, but cannot flush {parent}: {exc}") from None


# -- the pipeline -------------------------------------------------------------------------


def convert(
    images: str | os.PathLike[str],
    labels: str | os.PathLike[str],
    out: str | os.PathLike[str],
    backend: str = "lmdb",
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> ConvertResult:
    """Convert an MNIST image file and label file into a Caffe Datum database.

    Writes, for item ``i``, key ``b"%08d" % i`` and a serialized ``caffe.Datum`` with
    ``channels=1, height=rows, width=cols``, the item's pixels as ``data`` and its label:
    the same keys and values as Caffe's ``convert_mnist_data``.

    Args:
        images: IDX image file (magic 2051), plain or gzip.
        labels: IDX label file (magic 2049), plain or gzip.
        out: database directory to create; must not exist unless ``overwrite``.
        backend: ``"lmdb"`` (default) or ``"leveldb"``.
        batch_size: records per transaction (Caffe: 1000).
        overwrite: replace an existing database at ``out``.
        progress: called as ``progress(done, total)`` after each batch.

    Returns:
        A :class:`ConvertResult`.

    Raises:
        IdxFormatError: either input is missing, malformed, or they do not match.
        OutputExistsError: ``out`` exists (and ``overwrite`` is false), or cannot be replaced.
        BackendError: unknown backend, or the database could not be written.
    """
    start = time.perf_counter()
    out = os.fspath(out)
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if batch_size < 1:
        raise Mnist2dbError(f"batch size must be at least 1, got {batch_size}")
    with open_idx(images) as image_reader, open_idx(labels) as label_reader:
        check_pair(image_reader.header, label_reader.header)
        count = image_reader.header.count
        rows, cols = image_reader.header.dims[1], image_reader.header.dims[2]
        value_size = len(datum_prefix(1, rows, cols, rows * cols)) + rows * cols + 3
        size_hint = 2 * count * (_round_page(value_size + 8 + 16)) + (16 << 20)
        with _staged_directory(out, overwrite) as staging:
            writer = open_writer(
                backend, staging, size_hint=size_hint, append=count <= _APPEND_LIMIT
            )
            try:
                done = 0
                # Raw bytes in, bytes out: no numpy and no per-record message objects.
                batches = zip(
                    image_reader.iter_raw_batches(batch_size),
                    label_reader.iter_raw_batches(batch_size),
                    strict=True,
                )
                for image_batch, label_batch in batches:
                    n = len(label_batch)
                    values = encode_raw_batch(image_batch, label_batch, rows, cols)
                    writer.write_batch(list(zip(record_keys(done, n), values, strict=True)))
                    done += n
                    if progress is not None:
                        progress(done, count)
            except BaseException:
                writer.abort()
                raise
            writer.close()
    return ConvertResult(
        path=out,
        backend=backend,
        count=count,
        rows=rows,
        cols=cols,
        seconds=time.perf_counter() - start,
    )


_TRIPLES = [b"%03d" % i for i in range(1000)]


def record_keys(start: int, count: int) -> Sequence[bytes]:
    """The keys ``b"%08d" % i`` for ``i`` in ``range(start, start + count)``, as Caffe writes them.

    Built a thousand at a time from five leading digits joined onto the precomputed last
    three, and cut by struct: about five times faster than formatting each key.
    """
    end = start + count
    if end > _APPEND_LIMIT:
        return [b"%08d" % i for i in range(start, end)]
    parts = []
    i = start
    while i < end:
        block, low = divmod(i, 1000)
        stop = min(end, (block + 1) * 1000)
        head = b"%05d" % block
        parts.append(head + head.join(_TRIPLES[low : low + stop - i]))
        i = stop
    return splitter(8, count).unpack(b"".join(parts))


def _round_page(size: int, page: int = 4096) -> int:
    """LMDB packs small records into pages and gives large ones whole overflow pages."""
    if size <= page // 2:
        return size
    return -(-size // page) * page
