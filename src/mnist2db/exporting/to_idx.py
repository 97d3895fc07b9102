"""Write IDX files back from a database: ``PREFIX-images-idx3-ubyte`` and ``PREFIX-labels-idx1-ubyte``.

A database written with options (``mnist2db.json``, :mod:`mnist2db.recipe`) is mapped back
to its source items: a shuffle is undone (each record goes to the position of the item it
came from), a transposition too, so the files hold the source's items ``offset …
offset+count-1`` as the source stores them. The label file holds the Datum labels, as
uint8 (idx1): for a QMNIST source, the column the database was written with, not the
source's idx2-int rows (the other seven columns are not in the database).

The two files appear together or not at all (:mod:`mnist2db.storage.file_placement`): both targets are
checked before any work, both are written under temporary names, and both are placed, the
first put back if the second cannot be.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnist2db.errors import (
    ArgumentError,
    DatumError,
    OutputError,
    printable,
)
from mnist2db.exporting.samples import read_record
from mnist2db.formats.datum.message import key_text
from mnist2db.formats.idx.header import IMAGES_MAGIC, LABELS_MAGIC, pack_header
from mnist2db.formats.imdecode.png_decoder import decoded_datum
from mnist2db.formats.png.encoder import datum_encoding
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import Recipe, item_range, read_metadata
from mnist2db.selection import permutation
from mnist2db.storage.databases.backends import DEFAULT_BATCH_SIZE as _BATCH
from mnist2db.storage.databases.readers import shared_reader
from mnist2db.storage.destinations import check_apart
from mnist2db.storage.file_placement import check_file_target, place_together, recover_together
from mnist2db.storage.files import AtomicFile, check_made, make_parents, remove_made

#: What an empty database is exported as: it records no image size, so MNIST's.
EMPTY_SHAPE = (28, 28)
#: Caffe's database names: ``mnist_train_lmdb``, ``mnist_test_leveldb``, ``<name>_train_lmdb``.
_CAFFE_NAME = re.compile(r"(?:.*[_-])?(train|test)[_-](?:lmdb|leveldb)", re.IGNORECASE)


@dataclass(frozen=True)
class ExportResult:
    images: str
    labels: str
    count: int
    rows: int
    cols: int
    #: How the records were mapped back to source items (none for a plain database).
    notes: tuple[str, ...] = ()


def _decode_record(db_path: str, key: bytes, value: bytes) -> Any:
    """A record as a raw Datum: parsed, checked, an encoded image decoded."""
    return decoded_datum(read_record(db_path, key, value), f"{db_path}: key {key_text(key)}")


def default_prefix(db: str | os.PathLike[str]) -> str:
    """The file-name stem for :func:`export_db`, from Caffe's database names only.

    ``…_train_lmdb`` / ``…_train_leveldb`` give ``train``, ``…_test_…`` give ``t10k``
    (MNIST's names); any other name (``latest_lmdb``, ``digits``) is used as it is.
    """
    name = os.path.basename(os.path.normpath(os.fsdecode(db)))
    match = _CAFFE_NAME.fullmatch(name)
    if match is None:
        return name
    return "train" if match.group(1).lower() == "train" else "t10k"


def export_db(
    db: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Write ``PREFIX-images-idx3-ubyte`` and ``PREFIX-labels-idx1-ubyte`` from a database of
    single-channel uint8 Datums, in key order. For a database made by ``convert`` the files
    equal the sources byte for byte. An empty database gives two files of 0 items (images
    of 28 × 28: a database of no records does not record a size).

    Both targets are checked first; both files are written under temporary names in
    ``out_dir`` (created if missing, and removed again if the export fails) and placed
    together: both appear, or neither does (an export killed half-way is rolled back by
    the next export of the same files).

    Raises:
        OutputExistsError: a target exists and ``overwrite`` is false, or is not a regular
            file, or ``out_dir`` is the database itself.
        DatumError: a record is not a 1-channel uint8 Datum of the first record's size, or
            its label does not fit a uint8 label file.
        BackendError: ``db`` is not a database.
    """
    progress = reporting(progress)
    db_path = os.fsdecode(db)
    out = os.fsdecode(out_dir)
    if not out:
        raise ArgumentError("the output directory is empty: name a directory")
    stem = prefix if prefix is not None else default_prefix(db_path)
    if not stem or os.sep in stem:
        # The files go into out_dir and nowhere else: a prefix is a name, not a path.
        raise ArgumentError(
            f"--prefix {stem!r}: a file name prefix, without '/' (OUT_DIR is the folder)"
        )
    images_out = os.path.join(out, f"{stem}-images-idx3-ubyte")
    labels_out = os.path.join(out, f"{stem}-labels-idx1-ubyte")
    check_apart(out, [db_path])  # before recovering anything in it
    if os.path.isdir(out):
        recover_together([images_out, labels_out])
    for target in (images_out, labels_out):
        check_file_target(target, overwrite, [db_path], makes_parents=True)
    with shared_reader(db_path) as reader:
        # Through the reader: the options of these records, whatever replaces them meanwhile.
        found = read_metadata(reader)
        recipe = Recipe() if found is None else found[0]
        total = len(reader)
        rows, cols = EMPTY_SHAPE
        if total:
            first_key = reader.first_key() or b""
            first = _decode_record(db_path, first_key, reader.get(first_key) or b"")
            rows, cols = int(first.height), int(first.width)
        if found is not None and recipe.count != total:
            raise DatumError(
                f"{db_path}: holds {total} records, its {found[1]['source']['images']} "
                f"conversion wrote {recipe.count}; was it changed?"
            )
        try:
            made = make_parents(out)
        except OSError as exc:
            raise OutputError(f"{out}: cannot create directory: {exc.strerror}") from None
        try:
            check_made(made)  # never written through a link put in place of one of them
            count = _write_pair(reader, db_path, (images_out, labels_out), total, rows, cols,
                                progress, recipe)  # fmt: skip
        except OSError as exc:
            remove_made(made)
            raise OutputError(
                f"{exc.filename or out}: cannot write: {exc.strerror or exc}"
            ) from None
        except BaseException:
            remove_made(made)
            raise
    progress(count, total)
    if recipe.transpose:
        rows, cols = cols, rows
    return ExportResult(images_out, labels_out, count, rows, cols, _notes(recipe, found))


def _notes(recipe: Recipe, found: tuple[Recipe, dict[str, Any]] | None) -> tuple[str, ...]:
    if found is None:
        return ()
    source = found[1]["source"]
    notes = [f"items {item_range(recipe)} of {printable(source['images'])}"]
    if recipe.seed is not None:
        notes.append(f"put back in source order (shuffle seed {recipe.seed})")
    if recipe.transpose:
        notes.append("images transposed back as the source stores them")
    if source["label_magic"] != "0x00000801":
        notes.append(
            f"labels: column {recipe.label_column} of the idx2-int source, as uint8 idx1 "
            "(the database holds no other column)"
        )
    return tuple(notes)


def _write_pair(
    reader: Any,
    db_path: str,
    targets: tuple[str, str],
    total: int,
    rows: int,
    cols: int,
    progress: Progress,
    recipe: Recipe,
) -> int:
    """Write both files under temporary names and place them together; returns the count.

    Records in key order are written in turn; a shuffled database's records go back to
    the positions of the source items they hold. Labels (one byte a record) are collected
    and written after the images.
    """
    with AtomicFile(targets[0]) as image_target, AtomicFile(targets[1]) as label_target:
        stored = (cols, rows) if recipe.transpose else (rows, cols)
        head = pack_header(IMAGES_MAGIC, total, *stored)
        image_target.write(head)
        labels = np.zeros(total, dtype=np.uint8)
        records = _records(reader, db_path, rows, cols)
        if recipe.seed is None:
            count = _write_in_order(records, image_target, labels, progress, recipe, total)
        else:
            count = _write_unshuffled(records, image_target, labels, progress, recipe, total,
                                      len(head), rows * cols)  # fmt: skip
        label_target.write(pack_header(LABELS_MAGIC, total))
        label_target.write(labels.tobytes())
        if count != total:
            raise DatumError(
                f"{db_path}: read {count} records, the database reported {total} "
                "(was it changed while exporting?)"
            )
        # Both complete: only now do they reach their names, together.
        place_together([image_target, label_target])
    return count


def _write_in_order(
    records: Iterator[Any],
    image_target: AtomicFile,
    labels: Any,
    progress: Progress,
    recipe: Recipe,
    total: int,
) -> int:
    """Append each record's pixels in key order; returns how many records there were."""
    pending: list[bytes] = []
    count = 0
    for datum in records:
        if count < total:
            labels[count] = datum.label
        pending.append(_image_bytes(datum, recipe))
        count += 1
        if len(pending) == _BATCH:
            image_target.write(b"".join(pending))
            pending.clear()
            progress(count, total)
    image_target.write(b"".join(pending))
    return count


def _records(reader: Any, db_path: str, rows: int, cols: int) -> Iterator[Any]:
    """The Datums of ``reader`` in key order, each checked to fit an IDX image and label."""
    for key, value in reader:
        where = f"{db_path}: key {key_text(bytes(key))}"
        datum = _decode_record(db_path, bytes(key), bytes(value))
        if (datum.channels, datum.height, datum.width) != (1, rows, cols):
            raise DatumError(
                f"{where}: Datum {datum.channels}×{datum.height}×{datum.width}, "
                f"an IDX image file needs every record 1×{rows}×{cols}"
            )
        if len(datum.data) != rows * cols:
            raise DatumError(
                f"{where}: not raw uint8 pixels ({datum_encoding(datum)}, "
                f"{len(datum.data)} data bytes)"
            )
        if not 0 <= datum.label <= 255:
            raise DatumError(f"{where}: label {datum.label} does not fit a uint8 IDX label file")
        yield datum


def _untransposed(data: bytes, rows: int, cols: int) -> bytes:
    return np.frombuffer(data, dtype=np.uint8).reshape(rows, cols).T.tobytes()


def _write_unshuffled(
    records: Iterator[Any],
    image_target: AtomicFile,
    labels: Any,
    progress: Progress,
    recipe: Recipe,
    total: int,
    head_size: int,
    size: int,
) -> int:
    """Write each record at the position of the source item it holds (the permutation drawn
    again from the recorded seed): random writes into the image file."""
    order = permutation(recipe.seed or 0, total)
    count = 0
    try:
        image_target.stream.flush()
        fd = image_target.stream.fileno()
        for datum in records:
            if count >= total:
                count += 1
                break
            position = int(order[count])
            os.pwrite(fd, _image_bytes(datum, recipe), head_size + position * size)
            labels[position] = datum.label
            count += 1
            if count % _BATCH == 0:
                progress(count, total)
        # The file's length is set once: a database of no records leaves no hole to fill.
        os.ftruncate(fd, head_size + total * size)
        os.lseek(fd, 0, os.SEEK_END)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, image_target.path) from None
    return count


def _image_bytes(datum: Any, recipe: Recipe) -> bytes:
    """A record's pixels as the source stores them (transposed back if it was transposed)."""
    rows, cols = datum.height, datum.width
    return _untransposed(datum.data, rows, cols) if recipe.transpose else bytes(datum.data)
