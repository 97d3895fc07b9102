"""The one conversion pipeline: IDX images + labels -> Caffe Datum records -> LMDB or LevelDB.

Every front end (``mnist2db convert``, ``convert_mnist_data``, the Python API) calls
:func:`convert`. Records are streamed a batch at a time: memory is bounded by the batch, not
by the dataset. The database is built in a staging directory beside the destination and
moved into place only once it is complete and flushed to disk, so a failed or killed
conversion never leaves a partial database under the final name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

from mnist2db.errors import ArgumentError, BackendError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.datum.frames import encode_raw_framed
from mnist2db.formats.datum.message import (
    KEY_LIMIT,
    check_record_count,
    datum_prefix,
    encode_raw_batch,
    record_keys,
)
from mnist2db.formats.idx.header import LABELS_MAGIC, check_pair
from mnist2db.formats.idx.reader import IdxReader, open_idx
from mnist2db.formats.png.encoder import (
    DEFAULT_PNG_COMPRESSION,
    check_encoding,
    check_png_compression,
)
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import (
    Recipe,
    metadata_for,
    write_digest,
    write_metadata,
)
from mnist2db.selection import check_label_column, check_range, fresh_seed, iter_records, seed_note
from mnist2db.storage.databases.backends import (
    DEFAULT_BACKEND,
    DEFAULT_BATCH_SIZE,
    batch_records,
    check_backend,
    check_batch_size,
    open_writer,
    size_hint,
)
from mnist2db.storage.db_staging import staged_database, staged_databases
from mnist2db.storage.destinations import labels_path
from mnist2db.storage.files import TEMP_MARK
from mnist2db.storage.record_digest import FramedItems, RecordDigest, digest_items

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from mnist2db.formats.idx.header import IdxHeader
    from mnist2db.storage.files import PathArg


#: Marker in the names of staging directories, so left-overs are recognisable.
STAGING_MARK = TEMP_MARK


@named_tuple
class ConvertResult(NamedTuple):
    """What :func:`convert` wrote (immutable).

    Fields: ``path``, ``backend``, ``count``, ``rows``, ``cols`` (of the records written:
    swapped when ``transposed``), ``seconds``, ``seed`` (of a shuffle, else None),
    ``transposed``.
    """

    path: str
    backend: str
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    rows: int
    cols: int
    seconds: float
    seed: int | None = None
    transposed: bool = False

    def summary(self) -> str:
        """What Caffe's convert_mnist_data logs, then where the database went and how fast."""
        extra = "" if self.seed is None else f"{seed_note(self.seed)}\n"
        if self.transposed:
            extra += "Images transposed (height and width swapped).\n"
        return (
            f"A total of {self.count} items.\n"
            f"Rows: {self.rows} Cols: {self.cols}\n"
            f"Processed {self.count} files.\n{extra}"
            f"Wrote {printable(self.path)} ({self.backend}) in {self.seconds:.2f} s."
        )


# -- the pipeline -------------------------------------------------------------------------


def convert(
    images: PathArg,
    labels: PathArg,
    out: PathArg,
    backend: str = DEFAULT_BACKEND,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
    progress: Progress | None = None,
    transpose: bool = False,
    label_column: int = 0,
    shuffle: bool = False,
    seed: int | None = None,
    offset: int = 0,
    count: int | None = None,
    encoded: str | None = None,
    png_compression: str = DEFAULT_PNG_COMPRESSION,
    label_db: bool = False,
    on_start: Callable[[IdxHeader, IdxHeader], None] | None = None,
) -> ConvertResult:
    """Convert an MNIST image file and label file into a Caffe Datum database.

    Writes, for item ``i``, key ``b"%08d" % i`` and a serialized ``caffe.Datum`` with
    ``channels=1, height=rows, width=cols``, the item's pixels as ``data`` and its label:
    the same keys and values as Caffe's ``convert_mnist_data``. The options below change
    which items, in which order and orientation, with which label (:mod:`mnist2db.selection`);
    a database written with any of them also holds the file ``mnist2db.json`` recording
    them (never a record).

    Args:
        images: IDX image file (magic 2051), plain, gzip or xz.
        labels: IDX label file: uint8 labels (magic 2049) or QMNIST's int32 label rows
            (magic 0x0C02, ``idx2-int``); plain, gzip or xz.
        out: database directory to create; must not exist unless ``overwrite``.
        backend: ``"lmdb"`` (default) or ``"leveldb"``.
        batch_size: records per transaction (Caffe: 1000).
        overwrite: replace an existing ``backend`` database at ``out`` (see
            :func:`mnist2db.storage.destinations.check_replaceable`: never a directory holding anything
            else, nor one holding an input).
        progress: called as ``progress(done, total)`` after each batch.
        transpose: swap each image's height and width (EMNIST's stored images).
        label_column: the column of an idx2-int label file that becomes the label.
        shuffle: write the records in a random order seeded by ``seed`` (a fresh seed,
            reported in the result, when None); keys still run ``00000000…``.
        seed: 0 … 2**64-1; the same seed gives the same database byte for byte.
        offset, count: only source items ``offset … offset+count-1`` (count None: to the end).
        encoded: ``"png"``: each record's ``data`` a grayscale PNG of the image,
            ``encoded: true``, the shape fields filled in (:mod:`mnist2db.formats.png.encoder`).
        png_compression: with ``encoded="png"``: ``"fast"`` (mnist2db's own deflate, the
            bytes a function of the image alone) or ``"small"`` (zlib: ~12% smaller on
            MNIST, slower to write and to read); recorded, so ``verify`` encodes alike.
        label_db: also write ``OUT_labels``, each record's every label column (QMNIST's
            eight) as a float_data label record under the same key
            (:mod:`mnist2db.labels.databases`); the two are placed together.
        on_start: called as ``on_start(images_header, labels_header)`` once the inputs and
            the options and the destination are checked, before anything is written
            (the drop-in logs Caffe's opening lines there; whatever it raises stops the
            conversion, nothing written).

    Returns:
        A :class:`ConvertResult`.

    Raises:
        IdxFormatError: either input is missing, malformed, or they do not match; a label
            column the file lacks; a range that does not fit.
        OutputExistsError: ``out`` exists (and ``overwrite`` is false), or cannot be replaced.
        BackendError: unknown backend, or the database could not be written.
    """
    progress = reporting(progress)
    start = time.perf_counter()
    images, labels, out = os.fsdecode(images), os.fsdecode(labels), os.fsdecode(out)
    check_backend(backend)
    check_batch_size(batch_size)
    if not out:
        raise ArgumentError("the destination path is empty: name a directory to create")
    if seed is not None and not shuffle:
        raise ArgumentError("a seed orders a shuffle: ask for shuffle too")
    if shuffle and seed is None:
        seed = fresh_seed()
    if encoded is not None:
        check_encoding(encoded)
    check_png_compression(png_compression, encoded)
    recipe = Recipe(
        transpose,
        label_column,
        offset,
        count,
        seed if shuffle else None,
        encoded,
        None if encoded is None else png_compression,
    )
    with open_idx(images) as image_reader, open_idx(labels) as label_reader:
        check_pair(image_reader.header, label_reader.header, label_rows=True)

        def started() -> None:
            if on_start is not None:
                on_start(image_reader.header, label_reader.header)

        if not recipe.plain or label_reader.header.magic != LABELS_MAGIC or label_db:
            return _convert_recipe(
                image_reader, label_reader, out, backend, recipe, batch_size, overwrite,
                progress, started, label_db,
            )._replace(seconds=time.perf_counter() - start)  # fmt: skip
        count = image_reader.header.count
        check_record_count(count, images, "items")
        rows, cols = image_reader.header.dims[1], image_reader.header.dims[2]
        value_size = raw_value_size(rows, cols)
        batch = batch_records(batch_size, value_size)
        with staged_database(
            out, backend, overwrite=overwrite, inputs=(images, labels), on_checked=started
        ) as staging:
            # Raw bytes in, bytes out: no numpy and no per-record message objects.
            batches = zip(
                image_reader.iter_raw_batches(batch),
                label_reader.iter_raw_batches(batch),
                strict=True,
            )
            write_database(
                backend,
                staging,
                value_size,
                _framed_batches(batches, rows, cols),
                count,
                progress,
                streaming=image_reader.streaming,
                keyed=True,
            )
    return ConvertResult(
        path=out,
        backend=backend,
        count=count,
        rows=rows,
        cols=cols,
        seconds=time.perf_counter() - start,
    )


def _framed_batches(
    batches: Iterable[tuple[Any, Any]], rows: int, cols: int
) -> Iterable[list[tuple[bytes, bytes]]]:
    """The records of raw IDX batches under Caffe's keys, each batch laid out as the
    records' digest frames it (:func:`~mnist2db.formats.datum.message.encode_raw_framed`): the
    digest hashes the encoder's own buffer."""
    done = 0
    for images, labels in batches:
        encoded = encode_raw_framed(images, labels, rows, cols, done)
        if encoded is None:  # a label of 128 or more: records of two lengths
            values = encode_raw_batch(images, labels, rows, cols)
            yield list(zip(record_keys(done, len(values)), values, strict=True))
        else:
            layout, pairs = encoded
            items = FramedItems(pairs)
            items.framed = [layout]
            yield items
        done += len(labels)


def raw_value_size(rows: int, cols: int) -> int:
    """The bytes of a plain conversion's record of ``rows`` x ``cols`` pixels (a label below
    128: Caffe's 795 bytes for 28 x 28)."""
    return len(datum_prefix(1, rows, cols, rows * cols)) + rows * cols + 3


def _convert_recipe(
    image_reader: IdxReader,
    label_reader: IdxReader,
    out: str,
    backend: str,
    recipe: Recipe,
    batch_size: int,
    overwrite: bool,
    progress: Progress,
    started: Callable[[], None],
    label_db: bool = False,
) -> ConvertResult:
    """The pipeline with options: numpy batches from :func:`mnist2db.selection.iter_records`
    (and with ``label_db``, the label rows of the records, in their order, to a label
    database placed with it)."""
    from mnist2db.formats.datum.message import encode_batch
    from mnist2db.formats.png.encoder import check_png_shape, encode_png_batch

    header = image_reader.header
    check_label_column(label_reader.header, recipe.label_column)
    stop = check_range(image_reader.path, header.count, recipe.offset, recipe.count)
    total = stop - recipe.offset
    check_record_count(total, image_reader.path, "items")
    rows, cols = header.dims[1], header.dims[2]
    if recipe.transpose:
        rows, cols = cols, rows
    if recipe.encoded:  # a side of 0: no PNG can hold it, refused before any work
        check_png_shape(rows, cols, image_reader.path)
    value_size = len(datum_prefix(1, rows, cols, rows * cols)) + rows * cols + 11
    batch = batch_records(batch_size, value_size)
    inputs = (image_reader.path, label_reader.path)
    outs = [out, labels_path(out)] if label_db else [out]
    with staged_databases(
        outs, backend, overwrite=overwrite, inputs=inputs, on_checked=started
    ) as stagings:
        staging = stagings[0]
        label_rows = _LabelRows(stagings[1]) if label_db else None
        batches = iter_records(
            image_reader, label_reader, recipe, batch, spill_dir=staging,
            on_rows=None if label_rows is None else label_rows.add,
        )  # fmt: skip
        write_database(
            backend,
            staging,
            value_size,
            (
                encode_png_batch(images, labels, recipe.png_compression or DEFAULT_PNG_COMPRESSION)
                if recipe.encoded
                else encode_batch(images, labels)
                for images, labels in batches
            ),
            total,
            progress,
            streaming=image_reader.streaming,
        )
        if label_rows is not None:  # the label rows of the records just written, in order
            label_rows.write(backend, total, outs[1])
        write_metadata(staging, metadata_for(recipe, header, label_reader.header), out)
    return ConvertResult(
        path=out,
        backend=backend,
        count=total,
        rows=rows,
        cols=cols,
        seconds=0.0,
        seed=recipe.seed,
        transposed=recipe.transpose,
    )


class _LabelRows:
    """The label rows of the records, in key order, held in an unlinked file in the label
    database's staging directory while the images are written, then written as label
    records (:mod:`mnist2db.formats.datum.float_datum`) under the same keys."""

    def __init__(self, staging: str) -> None:
        import tempfile

        self.staging = staging
        self.spill = tempfile.TemporaryFile(dir=staging)  # noqa: SIM115 (closed in write)
        self.width = 0
        self.count = 0

    def add(self, rows: Any) -> None:
        import numpy as np

        values = np.asarray(rows, np.float32).reshape(len(rows), -1)
        self.width = values.shape[1]
        self.count += len(values)
        try:
            self.spill.write(values.tobytes())
        except OSError as exc:
            raise BackendError(f"{self.staging}: cannot hold the label rows: {exc}") from None

    def write(self, backend: str, total: int, out: str) -> None:
        import numpy as np

        from mnist2db.formats.datum.float_datum import encode_target_batch, target_value_size

        with self.spill:
            self.spill.flush()
            size = target_value_size(self.width or 1)
            per = batch_records(DEFAULT_BATCH_SIZE, size)
            rows = (
                np.memmap(self.spill, np.float32, "r", shape=(self.count, self.width))
                if self.count and self.width
                else np.zeros((0, 1), np.float32)
            )
            batches = (encode_target_batch(rows[i : i + per]) for i in range(0, self.count, per))
            write_database(backend, self.staging, size, batches, total, _quiet)


def _quiet(done: int, total: int) -> None:
    pass


def write_database(
    backend: str,
    staging: str,
    value_size: int,
    batches: Iterable[Sequence[bytes]] | Iterable[Sequence[tuple[bytes, bytes]]],
    total: int,
    progress: Progress,
    *,
    streaming: bool = False,
    keyed: bool = False,
    existing: bool = False,
    resumable: bool = False,
    committed: tuple[int, bytes | None] = (0, None),
    before_commit: Callable[[Sequence[tuple[bytes, bytes]]], None] | None = None,
) -> None:
    """Write ``total`` records, a batch of values at a time, under Caffe's keys into a new
    database in ``staging``: one transaction per batch, the writer aborted on any failure
    and closed (flushed) when all are written. The one batch writer of every database
    mnist2db makes (:func:`convert`, :func:`mnist2db.siamese.convert_siamese`).

    ``value_size`` (bytes per value) and ``streaming`` (the count is a pipe's promise) size
    LMDB's map (:func:`mnist2db.storage.databases.backends.size_hint`). ``keyed``: the batches hold
    ``(key, value)`` pairs in increasing key order (``convert_imageset``'s keys name the
    files) instead of values; ``total`` is then at most the number of records.
    ``existing``: add to the database already in ``staging`` (a resumed conversion's),
    which holds ``committed`` records, the last under ``committed[1]``.
    ``resumable``: the digest's state is saved before each commit
    (:mod:`mnist2db.storage.digest_state`), and a resumed run's digest continues from the
    state saved with the records it finds committed. ``before_commit(items)``: called with
    each batch once it is in its transaction, before the commit (what a resume checks).

    The records' digest is written beside them (``mnist2db.json``, which the caller's
    :func:`~mnist2db.recipe.write_metadata` keeps): ``verify DB`` checks it.
    When the next batch is asked for, the last one is written and read no more: its
    buffers may be reused (the imageset's workers' rings are).
    """
    check_record_count(total, staging)  # each writer checked already, before any work
    hint = size_hint(total, value_size, streaming=streaming)
    writer = open_writer(
        backend, staging, size_hint=hint, append=total <= KEY_LIMIT, existing=existing
    )
    digest, states = _run_digest(staging, existing, resumable, committed)
    hooks = [hook for hook in (before_commit, None if states is None else states.save) if hook]
    try:
        try:
            done = 0
            for values in batches:
                n = len(values)
                items = values if keyed else list(zip(record_keys(done, n), values, strict=True))
                digest.add(items)  # type: ignore[arg-type]  # hashed on its thread meanwhile
                writer.write_batch(items, _before(hooks, items))  # type: ignore[arg-type]
                digest.done_reading()
                done += n
                progress(done, total)
        except BaseException:
            writer.abort()
            raise
        writer.close()
        if existing and states is None:  # no saved state: the records read again
            digest.close()
            digest = _read_digest(backend, staging)
        write_digest(staging, digest, staging)
    finally:
        digest.close()


def _before(hooks: list[Any], items: Any) -> Callable[[], None] | None:
    """One call before a batch's commit: each hook given the batch."""
    if not hooks:
        return None

    def call() -> None:
        for hook in hooks:
            hook(items)

    return call


def _run_digest(
    staging: str, existing: bool, resumable: bool, committed: tuple[int, bytes | None]
) -> tuple[RecordDigest, Any]:
    """The run's digest, and the file its states are saved in (None: not resumable, or a
    resumed run without a saved state, whose finished database is then read again)."""
    if not resumable:
        return RecordDigest(), None
    from mnist2db.storage.digest_state import StateFile, resumable_digest, resumed_digest

    digest = resumed_digest(staging, *committed) if existing else resumable_digest()
    if digest is None:
        return RecordDigest(), None
    return digest, StateFile(staging, digest)


def _read_digest(backend: str, staging: str) -> RecordDigest:
    # A resumed run's digest without a saved state covers the batches committed before
    # it too: read them all again, in key order, from the finished staged database.
    from mnist2db.storage.databases.readers import DbReader  # a resumed run only

    with DbReader(staging, backend) as reader:
        return digest_items(reader)
