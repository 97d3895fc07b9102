"""``export --to files``: a database as one image file per record and Caffe's list file.

``OUT/list.txt`` holds ``PATH LABEL`` lines in key order, ``PATH`` relative to ``OUT``: what
``convert_imageset OUT/ OUT/list.txt NEW`` reads back. A record's file is, in this order:

1. the path its key names when ``convert_imageset`` wrote it (``%08d_PATH``,
   :func:`~mnist2db.exporting.samples.caffe_path`), with ``.png`` added for a raw record
   (whose pixels become a PNG): Caffe's tree is restored, so that ``convert_imageset
   --encoded`` on ``OUT/list.txt`` makes the same keys and values again. Two records of one
   path (a list that names a file twice) share the file when their bytes are equal;
   A gap in the keys' numbers (a line ``convert_imageset`` skipped, an image it could not
   read) is kept by a list line naming a file that does not exist (``.skipped/N``), so
   that the numbers of the keys made again are the same;
2. else ``LABEL/KEY.EXT`` (class folders, ImageFolder's layout), the key mapped to a safe
   name when it is not a plain one (:func:`~mnist2db.exporting.samples.file_stem`);

every file created with ``O_EXCL`` inside ``OUT``: nothing is ever followed out of it nor
written twice. Mapped names are listed in ``OUT/renamed.tsv`` (path, the key in hex and
as text). Class names, when known (``--classes``, or the ``DB.classes.txt`` that
``imageset`` writes beside a database made from class folders), go to ``OUT/classes.txt``;
``OUT/export.json`` records what was written (and marks ``OUT`` as an export's, which
``--overwrite`` checks). The tree appears complete or not at all
(:mod:`mnist2db.exporting.image_files.tree`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from mnist2db.errors import OutputError
from mnist2db.exporting.float_labels import TargetStream, csv_field, value_texts
from mnist2db.exporting.image_files.file_writer import IN_FLIGHT, FileWriter, small_files
from mnist2db.exporting.image_files.tree import MARKER, MARKER_FORMAT, staged_tree
from mnist2db.exporting.png_worker import worth_a_worker
from mnist2db.exporting.sample_batches import iter_batches, prefetched
from mnist2db.exporting.samples import Sample, SampleBatch, caffe_path, class_names, file_stem
from mnist2db.formats.datum.message import key_text
from mnist2db.formats.lists.image_list import listable
from mnist2db.interrupt import deferred
from mnist2db.progress import Progress, reporting
from mnist2db.storage.databases.readers import shared_reader

LIST_NAME = "list.txt"
CLASSES_NAME = "classes.txt"
RENAMED_NAME = "renamed.tsv"
#: Float targets beside the list (``label_db``: a label database, :mod:`mnist2db.labels.databases`):
#: a header ``path,v0,...`` and a row a record, in the list's order
#: (:mod:`mnist2db.exporting.float_labels`).
TARGETS_NAME = "targets.csv"
#: What a list line names for a line ``convert_imageset`` skipped (a gap in its keys' numbers:
#: an image it could not read): a path that is never written, so that it skips it again and
#: numbers the next keys as before.
SKIPPED_NAME = ".skipped"
#: The most such lines written in all (a gap of millions is not a skipped image).
SKIPPED_LIMIT = 1_000_000
#: The export's own files at the top of ``OUT``: a restored path may not begin with one.
RESERVED = (LIST_NAME, CLASSES_NAME, MARKER, RENAMED_NAME, TARGETS_NAME, SKIPPED_NAME)
_PROGRESS_EVERY = 1000
#: Directories kept open (their descriptors, a bounded number: far below the usual limit of
#: 1024 open files) to spare a walk from the root per file.
_DIRS_REMEMBERED = 256
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FilesResult:
    """What :func:`export_files` wrote: ``count`` records, of which ``restored`` at the path
    their ``convert_imageset`` key names, ``named`` at ``LABEL/KEY.EXT``, ``mapped`` under a
    safe name (listed in ``renamed.tsv``), ``shared`` sharing an equal file of the same
    path; ``encoded`` stored bytes as they are, ``raw`` written as PNG; ``files`` and
    ``bytes`` on disk; ``classes`` the class names written (none: not known); ``targets``
    the values a record in ``targets.csv``."""

    out: str
    count: int
    restored: int
    named: int
    mapped: int
    shared: int
    encoded: int
    raw: int
    files: int
    bytes: int
    classes: tuple[str, ...]
    examples: tuple[str, ...]
    #: Values a record in ``targets.csv`` (0: no ``label_db``).
    targets: int = 0


class _Tree:
    """Files created inside ``root`` only, each once (``O_EXCL``), counted. Every directory
    is made and opened relative to its parent's descriptor, never through a link
    (``O_NOFOLLOW``), and every file created relative to its directory's: a link planted
    in the staging directory, or put in place of a directory made here, is never followed
    out of it (a name it takes is a name taken)."""

    def __init__(self, root: str, shown: str) -> None:
        self.root = root
        self.shown = shown  # the name ``root`` is given when an error names it
        self.root_fd = os.open(root, _DIRECTORY)
        self.dirs: dict[str, int] = {"": self.root_fd}
        self.files = 0
        self.bytes = 0

    def close(self) -> None:
        for fd in self.dirs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.dirs = {}

    def _directory(self, relative: str) -> int | None:
        """The descriptor of directory ``relative`` (made if missing); None when its name,
        or a parent's, is taken by something else (a file, a link)."""
        fd = self.dirs.get(relative)
        if fd is not None:
            return fd
        up, _, name = relative.rpartition("/")
        parent = self._directory(up)
        if parent is None:
            return None
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass  # ours already, or taken: the open below tells
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"{self.root}/{relative}") from None
        try:
            fd = os.open(name, _DIRECTORY, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return None  # a link or a file of that name is already there
            raise OSError(exc.errno, exc.strerror, f"{self.root}/{relative}") from None
        if len(self.dirs) >= _DIRS_REMEMBERED:  # the parent's descriptor is used no more
            for known in self.dirs.values():
                if known != self.root_fd:
                    os.close(known)
            self.dirs = {"": self.root_fd}
        self.dirs[relative] = fd
        return fd

    def open_new(self, name: str, buffering: int = -1) -> Any:
        """A new file ``name`` at the top of the tree (``O_EXCL``, never through a link),
        open for writing."""
        try:
            fd = os.open(name, _CREATE, 0o666, dir_fd=self.root_fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"{self.root}/{name}") from None
        return os.fdopen(fd, "wb", buffering=buffering)

    def create(self, relative: str, data: bytes | memoryview) -> str | None:
        """Write ``data`` at ``relative``: "new"; "shared" when an equal file is there;
        None when the name is taken (another file, or a directory)."""
        # A relative path is never absolute (caffe_path and file_stem see to it), and is
        # written at once: a few microseconds a file, 60,000 files.
        up, _, name = relative.rpartition("/")
        directory = self._directory(up)
        if directory is None:
            return None
        try:
            fd = os.open(name, _CREATE, 0o666, dir_fd=directory)
        except FileExistsError:
            return "shared" if _holds(name, data, directory) else None
        except (NotADirectoryError, IsADirectoryError):
            return None
        try:
            written = os.write(fd, data)
            if written < len(data):  # a short write: the rest
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"{self.root}/{relative}") from None
        finally:
            os.close(fd)
        self.files += 1
        self.bytes += len(data)
        return "new"


def _holds(path: str, data: bytes | memoryview, directory: int | None = None) -> bool:
    """True when ``path`` (in ``directory``, a descriptor, when given) is a regular file
    holding exactly ``data`` (a link is never followed). Four system calls: a database that names one file
    many times (a list that names it again and again) checks it as often."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=directory)  # fmt: skip
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != len(data):
            return False
        found = os.read(fd, len(data) + 1)
        while 0 < len(found) < len(data):  # a short read
            more = os.read(fd, len(data) - len(found))
            if not more:
                break
            found += more
        return found == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _place(tree: _Tree, sample: Sample, index: int) -> tuple[str, str]:
    """Write ``sample``; returns its path and how it was named ("restored", "shared",
    "named", "mapped")."""
    path = caffe_path(sample.key, RESERVED)
    if path is not None:
        if not sample.encoded and not path.lower().endswith(".png"):
            path += ".png"
        # A path no list line reads back (a blank at an end) is not restored: mapped below.
        made = tree.create(path, sample.data) if listable(path.encode()) else None
        if made is not None:
            return path, "restored" if made == "new" else "shared"
    stem, mapped = file_stem(sample.key)
    how = "mapped" if mapped or path is not None or _caffe_key(sample.key) else "named"
    path = f"{sample.label}/{stem}.{sample.ext}"
    if tree.create(path, sample.data) == "new":
        return path, how
    # Taken by a file of another key (a plain key equal to a mapped name): the record's place.
    path = f"{sample.label}/{stem}~{index}.{sample.ext}"
    if tree.create(path, sample.data) != "new":
        raise OutputError(f"{tree.shown}: cannot find a free name for key {key_text(sample.key)}")
    return path, "mapped"


def _caffe_number(key: bytes) -> int | None:
    """The line number in a ``convert_imageset`` key (``%08d_PATH``), else None."""
    head, sep, rest = key.partition(b"_")
    if sep and rest and len(head) >= 8 and head.isdigit():
        return int(head)
    return None


def _caffe_key(key: bytes) -> bool:
    """A ``convert_imageset`` key whose path could not be restored (unsafe)."""
    head, _, rest = key.partition(b"_")
    return len(head) >= 8 and head.isdigit() and bool(rest)


def export_files(
    db: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    classes: str | os.PathLike[str] | None = None,
    label_db: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> FilesResult:
    """Write every record of ``db`` as an image file under ``out``, with ``out/list.txt``.

    One pass in key order, a batch of records in memory at a time. ``classes``: a file of
    class names, one a line in label order (default: ``DB.classes.txt`` beside ``db`` when
    it exists). ``label_db``: ``db``'s label database, read in the same pass (checked to be
    its pair, as ``verify --label-db`` checks), its targets written to ``out/targets.csv``.

    Raises:
        OutputExistsError: ``out`` exists (without ``overwrite``, or is not an export's), or
            is, holds or lies inside the database.
        DatumError: a record is not a Datum, or is raw with other than 1 or 3 channels.
        VerifyError: ``label_db`` is not ``db``'s label database (naming the first key that
            breaks the pair; the counts before any work).
        OutputError: a file cannot be written (a full disk: nothing is left under ``out``).
        BackendError: ``db`` is not a database.
    """
    progress = reporting(progress)
    db_path = os.fsdecode(db)
    out_path = os.fsdecode(out)
    labels_path = os.fsdecode(label_db) if label_db is not None else None
    names, classes_path = class_names(db_path, classes)
    inputs = [db_path] + [p for p in (classes_path, labels_path) if p]
    counts = dict.fromkeys(("restored", "shared", "named", "mapped", "encoded", "raw"), 0)
    examples: list[str] = []
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(shared_reader(db_path))
        total = len(reader)
        # Values as views of LMDB's map (written before the reader closes): no copy.
        records: Iterable[tuple[bytes, Any]] = reader.iter_views()
        targets = None
        if labels_path is not None:
            label_reader = stack.enter_context(shared_reader(labels_path))
            targets = TargetStream(db_path, labels_path, reader, label_reader)
            records = targets.records(records, label_reader)
        with staged_tree(out_path, inputs, overwrite) as staging:
            try:
                tree = _Tree(staging, out_path)
            except OSError as exc:
                raise OutputError(f"{out_path}: cannot write: {exc.strerror or exc}") from None
            try:
                count = _write_tree(records, db_path, tree, counts, examples, total, progress,
                                    targets)  # fmt: skip
                if names:
                    text = "".join(f"{name}\n" for name in names).encode("utf-8")
                    _write_file(CLASSES_NAME, text, tree)
                marker = {
                    "format": MARKER_FORMAT,
                    "version": 1,
                    "to": "files",
                    "source": db_path,
                    **({"label_db": labels_path} if labels_path is not None else {}),
                    "records": count,
                    **counts,
                    "files": tree.files,
                    "bytes": tree.bytes,
                }
                data = (json.dumps(marker, indent=1) + "\n").encode()
                with tree.open_new(MARKER) as stream:
                    stream.write(data)
            except OSError as exc:
                where = exc.filename or out_path
                if isinstance(where, str) and where.startswith(staging):
                    where = out_path + where[len(staging) :]
                raise OutputError(f"{where}: cannot write: {exc.strerror or exc}") from None
            finally:
                tree.close()
    progress(count, total)
    return FilesResult(
        out_path, count, counts["restored"], counts["named"], counts["mapped"], counts["shared"],
        counts["encoded"], counts["raw"], tree.files, tree.bytes, names, tuple(examples),
        targets.width if targets is not None else 0,
    )  # fmt: skip


def _write_file(name: str, data: bytes, tree: _Tree) -> None:
    with tree.open_new(name) as stream:
        stream.write(data)
    tree.files += 1
    tree.bytes += len(data)


def place_batch(
    tree: _Tree, batch: SampleBatch, start: int
) -> tuple[list[tuple[str, str]], int, int]:
    """Write the files of ``batch`` (its first record the export's ``start``), one after
    another; returns where each went and how it was named (:func:`_place`), and the files
    and bytes this added to ``tree``'s counts (run here, or in a
    :class:`~mnist2db.exporting.image_files.file_writer.FileWriter`: in its process, on its copy of
    ``tree``)."""
    files, size = tree.files, tree.bytes
    placed = [_place(tree, sample, start + i) for i, sample in enumerate(batch.samples())]
    return placed, tree.files - files, tree.bytes - size


def _file_writer(tree: _Tree) -> FileWriter | None:
    """A process to create the files beside this one where there are two CPUs and fork."""
    if not hasattr(os, "fork") or not worth_a_worker():
        return None
    return FileWriter(functools.partial(place_batch, tree), tree.shown)


def _write_tree(
    records: Iterable[tuple[bytes, Any]],
    db_path: str,
    tree: _Tree,
    counts: dict[str, int],
    examples: list[str],
    total: int,
    progress: Progress,
    targets: TargetStream | None = None,
) -> int:
    """Every record's file and its list line (and its targets' row); returns the count.

    Batches of small files are placed by a :class:`~mnist2db.exporting.image_files.file_writer.FileWriter`
    (forked first, before this export's threads and files), at most
    :data:`~mnist2db.exporting.image_files.file_writer.IN_FLIGHT` ahead of their list lines; any other
    batch here, once every batch before it is placed: in key order, one file after another,
    as if here alone."""
    writer = None
    try:
        # A signal during the fork is raised once the writer is made (os.fork runs handlers
        # of its own, which would swallow the exception), and the writer closed below.
        with deferred():
            writer = _file_writer(tree)
        count = _write_listed(records, db_path, tree, counts, examples, total, progress,
                              targets, writer)  # fmt: skip
    except BaseException:
        if writer is not None:
            writer.close(abort=True)  # before the tree is removed
        raise
    if writer is not None:
        writer.close()
    return count


def _write_listed(
    records: Iterable[tuple[bytes, Any]],
    db_path: str,
    tree: _Tree,
    counts: dict[str, int],
    examples: list[str],
    total: int,
    progress: Progress,
    targets: TargetStream | None,
    writer: FileWriter | None,
) -> int:
    listing = tree.open_new(LIST_NAME, buffering=1 << 20)
    renamed = None
    table = None
    if targets is not None:
        table = tree.open_new(TARGETS_NAME, buffering=1 << 20)
        names = [csv_field(name) for name in ["path", *targets.names]]
        head = ",".join(names).encode("utf-8", "surrogateescape") + b"\n"
        table.write(head)
        tree.files += 1
        tree.bytes += len(head)
    count = 0
    list_bytes = 0
    line_number = 0  # the list's next line: convert_imageset numbers its keys by line
    fillers = 0
    placing: deque[tuple[SampleBatch, Future[Any]]] = deque()

    def listed(batch: SampleBatch, placed: list[tuple[str, str]]) -> None:
        nonlocal count, list_bytes, line_number, fillers, renamed
        lines = []
        for key, label, (path, how) in zip(batch.keys, batch.labels, placed, strict=True):
            number = _caffe_number(key)
            if number is not None and line_number < number <= line_number + SKIPPED_LIMIT - fillers:
                gap = b"".join(
                    b"%s/%d 0\n" % (SKIPPED_NAME.encode(), n) for n in range(line_number, number)
                )
                lines.append(gap)
                fillers += number - line_number
                line_number = number
            line_number += 1
            counts[how] += 1
            lines.append(f"{path} {label}\n".encode())
            if table is not None and targets is not None:
                row = ",".join([csv_field(path), *value_texts(targets.take())]).encode() + b"\n"
                table.write(row)
                tree.bytes += len(row)
            if how == "mapped":
                if renamed is None:
                    renamed = tree.open_new(RENAMED_NAME)
                    renamed.write(b"path\tkey_hex\tkey\n")
                    tree.files += 1
                    tree.bytes += len(b"path\tkey_hex\tkey\n")
                row = f"{path}\t{key.hex()}\t{key_text(key)}\n".encode()
                renamed.write(row)
                tree.bytes += len(row)
                if len(examples) < 5:
                    examples.append(f"{key_text(key)} -> {path}")
        text = b"".join(lines)
        listing.write(text)
        list_bytes += len(text)
        counts["encoded" if batch.encoded else "raw"] += len(batch.keys)
        before = count
        count += len(batch.keys)
        if count // _PROGRESS_EVERY != before // _PROGRESS_EVERY:
            progress(count, total)

    def list_placed(batch: SampleBatch, future: Future[Any]) -> None:
        placed, files, size = future.result()
        tree.files += files
        tree.bytes += size
        listed(batch, placed)

    try:
        start = 0
        for batch in prefetched(iter_batches(db_path, records)):
            if writer is not None and small_files(batch):
                placing.append((batch, writer.submit(batch, start)))
            else:
                while placing:  # every file before this batch's first, placed
                    list_placed(*placing.popleft())
                listed(batch, place_batch(tree, batch, start)[0])
            start += len(batch.keys)
            while placing and (len(placing) > IN_FLIGHT or placing[0][1].done()):
                list_placed(*placing.popleft())
        while placing:
            list_placed(*placing.popleft())
        listing.close()
        if table is not None:
            table.close()
    except OSError as exc:
        # A buffered write names no file: the list's (the image files name theirs).
        raise OSError(exc.errno, exc.strerror, exc.filename or f"{tree.root}/{LIST_NAME}") from None
    finally:
        for stream in (listing, table):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):
                    stream.close()
        if renamed is not None:
            renamed.close()
    tree.files += 1
    tree.bytes += list_bytes
    return count
