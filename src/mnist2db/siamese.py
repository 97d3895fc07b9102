"""Pair databases for Caffe's siamese example, as ``convert_mnist_siamese_data`` writes them.

For each ``itemid`` in ``0 … pairs-1`` Caffe draws two items ``i`` and ``j`` uniformly
(``rand() % count``) and stores under key ``%08d`` of ``itemid`` a Datum with
``channels=2``, ``height=rows``, ``width=cols``, ``data`` = image ``i`` followed by image
``j``, and ``label`` = 1 if their labels are equal, else 0. Caffe seeds its generator from
the clock; here the draws come from numpy's PCG64 seeded with ``seed`` (a fresh random seed
when None, reported in the result), so one seed always gives the same database, byte for
byte: the draws are ``random_raw()`` words, whose stream numpy keeps stable across versions.

``balanced=True`` makes exactly ``pairs // 2`` pairs same-class (Caffe's uniform draws give
about 10% on MNIST), at random positions: for each pair the first item is drawn uniformly,
the second uniformly among the items of the same class (a positive pair) or of the other
classes (a negative pair).

The database also holds mnist2db's ``mnist2db.json`` (:mod:`mnist2db.recipe`; a file
beside the backend's own, never a record): the sources, the seed, the number of pairs, the
balance and how the pairs are drawn, so ``info`` shows the seed and the run can be repeated.

Images are needed in random order: they are streamed once (validated, gzip or plain, pipes
too) into an unlinked temporary file in the staging directory and memory-mapped, so memory
holds a batch, not the dataset; the labels (one byte per item) are held in memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mnist2db.conversion import write_database
from mnist2db.errors import ArgumentError, IdxFormatError, Mnist2dbError, printable
from mnist2db.formats.datum.message import INT32_MAX, check_record_count, datum_prefix, splitter
from mnist2db.formats.idx.header import IdxHeader, check_pair
from mnist2db.formats.idx.reader import open_idx
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import pairs_metadata, write_metadata
from mnist2db.selection import check_seed, fresh_seed
from mnist2db.storage.databases.backends import (
    DEFAULT_BATCH_SIZE,
    SIAMESE_BACKEND,
    batch_records,
    check_backend,
    check_batch_size,
)
from mnist2db.storage.db_staging import staged_database
from mnist2db.storage.spill import spill_to_map

if TYPE_CHECKING:
    from mnist2db.storage.files import PathArg


#: How the pairs are drawn from the seed, by balance (recorded in ``mnist2db.json``).
PAIRS_METHOD = {
    False: "PCG64(seed).random_raw, 2 words a pair: i = word % count, j = word % count",
    True: "PCG64(seed).random_raw, 4 words a pair: first, same-class, other-class, selection",
}


class SiameseResult(NamedTuple):
    """What :func:`convert_siamese` wrote (immutable).

    Fields: ``path``, ``backend``, ``count`` (pairs), ``positives`` (same-class pairs),
    ``rows``, ``cols``, ``seed`` (the seed used: pass it again for the same database),
    ``seconds``.
    """

    path: str
    backend: str
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    positives: int
    rows: int
    cols: int
    seed: int
    seconds: float

    def summary(self) -> str:
        share = 100 * self.positives / self.count if self.count else 0.0
        return (
            f"A total of {self.count} pairs of {self.rows} × {self.cols} images "
            f"({self.positives} same-class, {share:.1f}%), seed {self.seed}.\n"
            f"Wrote {printable(self.path)} ({self.backend}) in {self.seconds:.2f} s."
        )


def _load(images: str, labels: str, spill_dir: str) -> tuple[Any, Any, IdxHeader, IdxHeader]:
    """Validate both files; return (images as a read-only memory map, labels, both headers)."""
    with open_idx(images) as image_reader, open_idx(labels) as label_reader:
        check_pair(image_reader.header, label_reader.header)
        count = image_reader.header.count
        rows, cols = image_reader.header.dims[1], image_reader.header.dims[2]
        label_bytes = bytearray()
        for batch in label_reader.iter_raw_batches(1 << 16):
            label_bytes += batch
        size = rows * cols
        batches = image_reader.iter_raw_batches(max(1, (4 << 20) // max(size, 1)))
        pixels = spill_to_map(batches, count, size, spill_dir)
    labels_array = np.frombuffer(bytes(label_bytes), dtype=np.uint8)
    return pixels, labels_array, image_reader.header, label_reader.header


class _PairDrawer:
    """Draws ``(i, j)`` index pairs from a PCG64 stream of raw 64-bit words.

    Random pairs take two words per pair (``i = word % count``, as Caffe's ``rand() %
    count``). Balanced pairs take four: the first item, a same-class and an other-class
    candidate for the second, and a selection-sampling word that makes exactly
    ``total // 2`` of the pairs positive, at uniformly random positions. The draws do not
    depend on the batch size.
    """

    def __init__(self, labels: np.ndarray, seed: int, total: int, balanced: bool) -> None:
        self.count = len(labels)
        self.labels = labels
        self.bits = np.random.PCG64(seed)
        self.balanced = balanced
        self.remaining = total
        self.needed = total // 2
        if balanced:
            self.order = np.argsort(labels, kind="stable")
            counts = np.bincount(labels, minlength=256)
            self.starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.uint64)
            self.sizes = counts.astype(np.uint64)

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        count = np.uint64(self.count)
        per_pair = 4 if self.balanced else 2
        words = np.asarray(self.bits.random_raw(per_pair * n), dtype=np.uint64).reshape(n, per_pair)
        first = (words[:, 0] % count).astype(np.int64)
        if not self.balanced:
            return first, (words[:, 1] % count).astype(np.int64)
        positive = np.zeros(n, dtype=bool)
        for k, word in enumerate(words[:, 3].tolist()):
            if word % self.remaining < self.needed:
                positive[k] = True
                self.needed -= 1
            self.remaining -= 1
        classes = self.labels[first]
        start = self.starts[classes]
        size = self.sizes[classes]
        same = start + words[:, 1] % size
        r = words[:, 2] % np.maximum(count - size, np.uint64(1))
        different = np.where(r < start, r, r + size)
        position = np.where(positive, same, different).astype(np.int64)
        return first, self.order[position]


def convert_siamese(
    images: PathArg,
    labels: PathArg,
    out: PathArg,
    backend: str = SIAMESE_BACKEND,
    *,
    seed: int | None = None,
    pairs: int | None = None,
    balanced: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
    progress: Progress | None = None,
    on_start: Callable[[int, int, int], None] | None = None,
) -> SiameseResult:
    """Write a siamese pair database from an MNIST image file and label file.

    Args:
        images: IDX image file (magic 2051), plain or gzip.
        labels: IDX label file (magic 2049), plain or gzip.
        out: database directory to create; must not exist unless ``overwrite``.
        backend: ``"leveldb"`` (default, as Caffe) or ``"lmdb"``.
        seed: seed of the pair draws (0 … 2**64-1); None draws a fresh one.
        pairs: number of pairs (default: as many as images).
        balanced: exactly half the pairs same-class.
        batch_size: records per write batch.
        overwrite: replace an existing database at ``out``.
        progress: called as ``progress(done, total)`` after each batch.
        on_start: called as ``on_start(items, rows, cols)`` once the inputs are read,
            before the first pair is written.

    Raises:
        IdxFormatError: either input is missing, malformed, or they do not match.
        OutputExistsError: ``out`` exists (and ``overwrite`` is false), or cannot be replaced.
        BackendError: unknown backend, or the database could not be written.
        Mnist2dbError: a bad seed, pair count or batch size; no images to pair; balanced
            pairs asked of a single class.
    """
    progress = reporting(progress)

    start_time = time.perf_counter()
    images, labels, out = os.fsdecode(images), os.fsdecode(labels), os.fsdecode(out)
    check_backend(backend)
    check_batch_size(batch_size)
    if pairs is not None and pairs < 0:
        raise ArgumentError(f"the number of pairs must be at least 0, got {pairs}")
    if pairs is not None:
        check_record_count(pairs, out, "pairs")
    if seed is None:
        seed = fresh_seed()
    else:
        check_seed(seed)

    with staged_database(out, backend, overwrite=overwrite, inputs=(images, labels)) as staging:
        pixels, label_array, image_header, label_header = _load(images, labels, staging)
        rows, cols = image_header.dims[1], image_header.dims[2]
        count = len(label_array)
        if 2 * rows * cols > INT32_MAX:
            raise IdxFormatError(
                f"{images}: pairs of {rows} × {cols} images are too large for a Datum "
                f"(at most {INT32_MAX} bytes)"
            )
        total = count if pairs is None else pairs
        check_record_count(total, images, "pairs (one per image)")
        if total and not count:
            raise IdxFormatError(f"{images}: no images to pair")
        if balanced and total and len(np.unique(label_array)) < 2:
            raise Mnist2dbError(
                f"{labels}: every item has label {int(label_array[0])}: "
                "balanced pairs need at least two classes"
            )
        drawer = _PairDrawer(label_array, seed, total, balanced)
        value_size = len(datum_prefix(2, rows, cols, 2 * rows * cols)) + 2 * rows * cols + 2
        batch = batch_records(batch_size, value_size)
        if on_start is not None:
            on_start(count, rows, cols)
        positives = [0]
        batches = _pair_batches(pixels, label_array, drawer, rows, cols, total, batch, positives)
        write_database(backend, staging, value_size, batches, total, progress)
        del pixels
        metadata = pairs_metadata(
            image_header,
            label_header,
            seed=seed,
            pairs=total,
            balanced=balanced,
            method=PAIRS_METHOD[balanced],
        )
        write_metadata(staging, metadata, out)
    return SiameseResult(
        path=out,
        backend=backend,
        count=total,
        positives=positives[0],
        rows=rows,
        cols=cols,
        seed=seed,
        seconds=time.perf_counter() - start_time,
    )


def _pair_batches(
    pixels: np.ndarray,
    labels: np.ndarray,
    drawer: _PairDrawer,
    rows: int,
    cols: int,
    total: int,
    batch_size: int,
    positives: list[int],
) -> Iterator[Sequence[bytes]]:
    """The values of ``total`` pair records, ``batch_size`` at a time, in key order; the
    same-class pairs are counted into ``positives[0]``."""
    size = rows * cols
    prefix = np.frombuffer(datum_prefix(2, rows, cols, 2 * size), dtype=np.uint8)
    head = len(prefix)
    length = head + 2 * size + 2
    done = 0
    while done < total:
        n = min(batch_size, total - done)
        first, second = drawer.draw(n)
        same = (labels[first] == labels[second]).astype(np.uint8)
        matrix = np.empty((n, length), dtype=np.uint8)
        matrix[:, :head] = prefix
        matrix[:, head : head + size] = pixels[first]
        matrix[:, head + size : head + 2 * size] = pixels[second]
        matrix[:, head + 2 * size] = 0x28  # field 5 (label), varint
        matrix[:, head + 2 * size + 1] = same
        positives[0] += int(same.sum())
        yield splitter(length, n).unpack(matrix.tobytes())
        done += n
