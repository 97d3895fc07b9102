"""Label databases: each image's targets (several tags, real values) as a second database
beside the image database, under the same keys in the same order.

What users of Caffe build by hand with pycaffe, made one step and aligned by construction:
the image database is written as before, then its own keys are read back from the staging
directory, and for each one the label record (:mod:`mnist2db.formats.datum.float_datum`:
pycaffe's ``array_to_datum`` of the ``(N, 1, 1)`` float vector) is written under that very
key. An image skipped because it cannot be read, a shuffle, several workers or a resumed
run change which keys the image database holds and in what order; the label database
follows whatever it holds. Both are staged and placed together
(:func:`mnist2db.storage.db_staging.staged_databases`): they appear together or not at all.

The image records' own ``label`` is the first value when it is a whole number within
int32, else 0 (:func:`mnist2db.formats.lists.label_table.first_label`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from itertools import zip_longest
from typing import Any, NamedTuple

import numpy as np

from mnist2db.conversion import write_database
from mnist2db.errors import ImageError, Mnist2dbError, VerifyError, printable
from mnist2db.formats.datum.float_datum import (
    decode_targets,
    encode_target_batch,
    target_value_size,
)
from mnist2db.formats.datum.message import key_text
from mnist2db.formats.lists.image_list import ListEntry, image_key
from mnist2db.formats.lists.label_table import LabelTable, first_label, iter_rows
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import write_target_names
from mnist2db.storage.databases.backends import batch_records
from mnist2db.storage.databases.readers import open_reader
from mnist2db.storage.spill import spill_to_map

#: A batch of label records: ``(key, value)`` pairs in key order.
Batch = list[tuple[bytes, bytes]]


class TargetSource:
    """The images a label table names and their targets, in key order: the table's rows
    (its line numbers are the keys' ``%08d``), or, with ``order``, position ``k`` holding
    row ``order[k]`` (a shuffle; the keys then number positions, as Caffe's do).

    A shuffled source keeps each row's path and label in memory (as a shuffled image list
    does) and its values on disk (:func:`values_by_position`), never all in memory.
    """

    def __init__(self, table: LabelTable, order: np.ndarray | None = None) -> None:
        self.table = table
        self.order = order
        self._listed: list[tuple[bytes, int]] | None = None
        if order is not None:
            self._listed = [(row.path, first_label(row.values)) for row in iter_rows(table)]
            if len(order) != len(self._listed):
                raise ValueError(f"an order of {len(order)} for {len(self._listed)} rows")

    @property
    def width(self) -> int:
        return self.table.width

    def count(self) -> int:
        """The number of rows (reading the table when not shuffled)."""
        if self._listed is not None:
            return len(self._listed)
        return sum(1 for _ in iter_rows(self.table))

    def digest(self) -> str:
        """A digest of the table: its layout, width and every byte of the file (a resumed
        run's plan: a changed file is refused). Its bytes, not its rows: CelebA's 202,599
        rows hash in 0.09 s, and take 7 s to parse again."""

        digest = hashlib.sha256(b"%s %d:" % (self.table.layout.encode(), self.width))
        try:
            with open(self.table.path, "rb") as stream:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            raise ImageError(f"{self.table.path}: cannot read the labels: {exc.strerror}") from None
        return digest.hexdigest()

    def entries(self) -> Iterator[ListEntry]:
        """The image entries, in key order: ``ListEntry(number, path, first value)``."""
        if self._listed is None or self.order is None:
            for row in iter_rows(self.table):
                yield ListEntry(row.line, row.path, first_label(row.values))
            return
        listed = self._listed
        for position, row in enumerate(self.order.tolist()):
            path, label = listed[row]
            yield ListEntry(position, path, label)

    def values_by_position(self, spill_dir: str) -> Iterator[tuple[int, np.ndarray]]:
        """``(key number, float32 values)`` in key order (a shuffle's values spilled to an
        unlinked file in ``spill_dir``, read back in the shuffled order)."""
        if self.order is None:
            for row in iter_rows(self.table):
                yield row.line, row.values
            return
        count = len(self.order)
        size = 4 * self.width
        spilled = spill_to_map(
            (row.values.tobytes() for row in iter_rows(self.table)), count, size, spill_dir
        )
        for position, row in enumerate(self.order.tolist()):
            yield position, np.frombuffer(spilled[row].tobytes(), np.float32)


class LabelsResult(NamedTuple):
    """What :func:`write_label_database` wrote: ``path`` (the final name), ``count``
    (records: one per image record), ``width`` (values each) and ``names`` (the columns)."""

    path: str
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    width: int
    names: tuple[str, ...]


def write_label_database(
    backend: str,
    images_staging: str,
    labels_staging: str,
    source: TargetSource,
    out: str,
    *,
    batch_size: int = 1000,
    committed: int = 0,
    last_key: bytes | None = None,
    recorded: Callable[[Iterator[Batch]], Iterator[Batch]] | None = None,
) -> LabelsResult:
    """Write, into ``labels_staging``, one label record under each key of the image
    database staged in ``images_staging`` (``%08d_PATH``, the number naming the entry),
    in the same order; ``out`` is the label database's final name (for messages).

    ``committed``, ``last_key``: a resumed run's label database, already in
    ``labels_staging``, holds the records of the first ``committed`` image keys, the last
    of them ``last_key``: they stay, and the records after them are added. ``recorded``:
    wraps the batches (a resumable run records each one before it is committed).

    Raises:
        Mnist2dbError: an image key names no entry of ``source`` (the two did not come
            from one list: never for a database written from it), or the staged label
            database does not hold the first ``committed`` image keys.
    """
    width = source.width
    value_size = target_value_size(width)
    per_batch = batch_records(batch_size, value_size)  # bounded by bytes too
    state = {"count": committed}

    def batches() -> Iterator[list[tuple[bytes, bytes]]]:
        wanted = source.values_by_position(labels_staging)
        entries = source.entries()
        keys: list[bytes] = []
        rows: list[np.ndarray] = []
        seen = 0
        with open_reader(images_staging, backend) as reader:
            for key in reader.iter_keys():
                key = bytes(key)
                number = int(key[:8]) if key[:8].isdigit() and key[8:9] == b"_" else -1
                found = None
                for position, values in wanted:
                    entry = next(entries)
                    if position >= number:
                        found = (position, values, entry)
                        break
                if found is None or found[0] != number or image_key(found[2]) != key:
                    raise Mnist2dbError(
                        f"{out}: the image key {key[:60].decode(errors='replace')} names no "
                        "entry of the list, in order: nothing written"
                    )
                seen += 1
                if seen <= committed:  # a resumed run's: written already
                    if seen == committed and key != last_key:
                        raise Mnist2dbError(
                            f"{out}: --resume refused: the staged label database ends at "
                            f"{_key_text(last_key)}, image record {seen} is "
                            f"{_key_text(key)}; run without --resume to start again"
                        )
                    continue
                keys.append(key)
                rows.append(found[1])
                if len(keys) >= per_batch:
                    yield list(zip(keys, encode_target_batch(np.stack(rows)), strict=True))
                    state["count"] += len(keys)
                    keys, rows = [], []
        if keys:
            yield list(zip(keys, encode_target_batch(np.stack(rows)), strict=True))
            state["count"] += len(keys)
        if seen < committed:
            raise Mnist2dbError(
                f"{out}: --resume refused: the staged label database holds {committed} "
                f"records, the images {seen}; run without --resume to start again"
            )

    total = _count_keys(images_staging, backend)
    existing = bool(os.listdir(labels_staging))  # a resumed run's, begun (maybe empty)
    made = batches() if recorded is None else recorded(batches())
    write_database(backend, labels_staging, value_size, made, total, _no_progress,
                   keyed=True, existing=existing, resumable=True,
                   committed=(committed, last_key))  # fmt: skip
    write_target_names(labels_staging, source.table.names, out)
    return LabelsResult(out, state["count"], width, source.table.names)


def _key_text(key: bytes | None) -> str:

    return "no key" if key is None else key_text(key)


def _count_keys(path: str, backend: str) -> int:
    with open_reader(path, backend) as reader:
        return len(reader)


def _no_progress(done: int, total: int) -> None:
    pass


def describe(result: LabelsResult) -> str:
    """The summary line of a label database."""

    names = ""
    if result.names:
        shown = ", ".join(result.names[:5]) + (", …" if len(result.names) > 5 else "")
        names = f" ({shown})"
    return (
        f"Wrote {printable(result.path)}: {result.count} label records of {result.width} "
        f"float values{names}, under the image keys."
    )


class PairCheck(NamedTuple):
    """What :func:`verify_label_db` found: ``count`` records in each, ``width`` values each."""

    count: int  # type: ignore[assignment]  # the field hides tuple.count
    width: int


def iter_pairs(
    images: str,
    labels: str,
    image_records: Iterable[tuple[bytes, Any]],
    label_records: Iterable[tuple[bytes, bytes]],
    *,
    start: int = 0,
    counts: tuple[int, int] | None = None,
) -> Iterator[tuple[bytes, Any, np.ndarray]]:
    """``(key, image value, targets)`` of an image database and its label database read in
    step (``image_records`` and ``label_records`` in key order, from record ``start``): the
    pair check of :func:`verify_label_db`, for any reader of both in one pass.

    ``counts``: the two databases' record counts, compared before the first pair (so that
    a pair of other lengths is refused before any work).

    Raises:
        VerifyError: naming the first key that breaks the pair: a record missing on either
            side, another key at a position, a label record of another width than the first.
        DatumError: a label record is not one.
    """

    if counts is not None and counts[0] != counts[1]:
        raise VerifyError(
            f"{labels}: {counts[1]} label records for the {counts[0]} records of {images}: "
            "not its label database"
        )
    count = start
    width: int | None = None
    for image, label in zip_longest(image_records, label_records):
        if label is None:
            raise VerifyError(
                f"{labels}: no label record for the image key {key_text(bytes(image[0]))} "
                f"(record {count}: it holds fewer records than {images})"
            )
        key, value = bytes(label[0]), bytes(label[1])
        if image is None:
            raise VerifyError(
                f"{labels}: key {key_text(key)} (record {count}) has no image record in "
                f"{images} (it holds more records)"
            )
        if bytes(image[0]) != key:
            raise VerifyError(
                f"{labels}: key {key_text(key)} at record {count}, where {images} holds "
                f"{key_text(bytes(image[0]))}"
            )
        targets = decode_targets(value, f"{labels}: key {key_text(key)}", width)
        if width is None:
            width = len(targets)
        elif len(targets) != width:
            raise VerifyError(
                f"{labels}: key {key_text(key)} holds {len(targets)} values, the first "
                f"record {width}"
            )
        count += 1
        yield key, image[1], targets


def verify_label_db(
    db: str | os.PathLike[str],
    label_db: str | os.PathLike[str],
    progress: Progress | None = None,
) -> PairCheck:
    """Check that ``label_db`` is the label database of the database ``db``: the same keys
    in the same order, as many records, each a label record of the first one's width
    (``mnist2db verify DB --label-db LABEL_DB``).

    Raises:
        VerifyError: naming the first key that breaks it.
        BackendError: either is not a database.
    """

    report = reporting(progress)
    images, labels = os.fsdecode(db), os.fsdecode(label_db)
    count = 0
    width = 0
    with open_reader(images) as image_reader, open_reader(labels) as label_reader:
        total = len(image_reader)
        keys = ((key, None) for key in image_reader.iter_keys())
        for _, _, targets in iter_pairs(images, labels, keys, label_reader):
            width = len(targets)
            count += 1
            if count % 1000 == 0:
                report(count, total)
    report(count, count)
    return PairCheck(count, width)
