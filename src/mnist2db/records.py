"""The record stream: the source items a conversion's options select, in their order and
orientation, with their labels; and the checks of those options.

The options (all off by default, when ``convert`` writes exactly Caffe's records):

* ``transpose``: each image with its height and width swapped (EMNIST stores its images
  transposed; writing them transposed back makes them upright);
* ``label_column``: for a QMNIST ``idx2-int`` label file (int32 rows of 8 columns), the
  column that becomes the Datum label (0, the class, by default);
* ``offset``/``count``: source items ``offset … offset+count-1`` only;
* ``encoded`` (``"png"``): each record's ``data`` a PNG of the image, ``encoded: true``
  (:mod:`mnist2db.formats.png`); the order and the items are unchanged;
* ``seed`` (shuffle): the selected items in a seeded random order, still under the keys
  ``00000000…``: the permutation is ``argsort`` of ``count`` raw 64-bit words of numpy's
  PCG64 seeded with ``seed`` (a stream numpy keeps stable across versions).

What the options were is recorded in the database (:mod:`mnist2db.storage.metadata`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from mnist2db.errors import ArgumentError, IdxFormatError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.idx import QMNIST_LABELS_MAGIC

if TYPE_CHECKING:
    import numpy as np

    from mnist2db.formats.idx import IdxHeader
    from mnist2db.formats.idx_reader import IdxReader
    from mnist2db.storage.metadata import Recipe


def check_range(
    path: str,
    total: int,
    offset: int,
    count: int | None,
    *,
    clip: bool = False,
    unit: str = "items",
) -> int:
    """The end of the range ``offset … offset+count-1`` of a source of ``total`` items.

    ``count`` None means to the end. With ``clip`` (``show``) the range may stop early, but
    must start inside the source; without it (``convert``) it must fit whole.

    Raises:
        IdxFormatError: naming ``path`` and the range that does not fit.
    """
    if offset < 0 or (count is not None and count < 0):
        raise ArgumentError(f"offset and count must not be negative, got {offset} and {count}")
    stop = total if count is None else offset + count
    if clip:
        if offset >= total:
            raise IdxFormatError(f"{path}: offset {offset} is past the end ({total} {unit})")
        return min(stop, total)
    if offset > total or stop > total:
        wanted = f"items {offset} … {stop - 1} do" if stop > offset else f"offset {offset} does"
        raise IdxFormatError(
            f"{path}: {wanted} not fit: it holds {total} items (0 … {total - 1})"
            if total
            else f"{path}: {wanted} not fit: it holds no items"
        )
    return stop


def check_label_column(header: IdxHeader, column: int) -> None:
    """Check that ``column`` names a column of the label file ``header`` describes.

    Raises:
        IdxFormatError: one line naming the file and the columns it has.
    """
    if header.magic == QMNIST_LABELS_MAGIC:
        columns = header.dims[1]
        if not 0 <= column < columns:
            raise IdxFormatError(
                f"{header.path}: label column {column} does not exist: the file has "
                f"{columns} columns (0 … {columns - 1})"
            )
    elif column != 0:
        raise IdxFormatError(
            f"{header.path}: label column {column} needs an idx2-int label file "
            f"(magic 0x{QMNIST_LABELS_MAGIC:08x}); this one has one label per item "
            f"(magic 0x{header.magic:08x})"
        )


#: Seeds are unsigned 64-bit: PCG64 takes any, and ``mnist2db.json`` records them exactly.
SEED_LIMIT = 1 << 64


def check_seed(seed: int) -> None:
    """A seed must be an unsigned 64-bit integer."""
    if not 0 <= seed < SEED_LIMIT:
        raise ArgumentError(f"seed must be between 0 and 2**64-1, got {seed}")


def fresh_seed(limit: int = SEED_LIMIT) -> int:
    """A seed drawn from the operating system's randomness, below ``limit`` (a power of two:
    Caffe's drop-ins take a signed 64-bit ``--seed``, so theirs stop at ``1 << 63``)."""
    return int.from_bytes(os.urandom(8), "little") % limit


def seed_note(seed: int, flag: str = "--seed ") -> str:
    """The one phrasing of the seed a shuffle used, and how to repeat it (``flag``: the
    front end's spelling of the option, ``"--seed="`` for the gflags drop-ins)."""
    return f"Shuffled with seed {seed} ({flag}{seed} repeats it)."


def permutation(seed: int, count: int) -> np.ndarray:
    """The shuffled order: record ``k`` holds selected item ``permutation(seed, count)[k]``."""
    import numpy as np

    check_seed(seed)
    words = np.asarray(np.random.PCG64(seed).random_raw(count), dtype=np.uint64)
    order: np.ndarray = np.argsort(words, kind="stable")
    return order


def _label_values(batch: np.ndarray, column: int) -> np.ndarray:
    import numpy as np

    values = batch[:, column] if batch.ndim == 2 else batch
    return values.astype(np.int64)


def iter_records(
    image_reader: IdxReader,
    label_reader: IdxReader,
    recipe: Recipe,
    batch_size: int,
    spill_dir: str | os.PathLike[str] | None = None,
    on_rows: Callable[[np.ndarray], None] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The records ``recipe`` makes of a checked image/label pair, in key order.

    Yields ``(images, labels)``: uint8 ``(n, height, width)`` (transposed if asked) and the
    int64 Datum labels. A shuffle holds the selected images in an unlinked file in
    ``spill_dir`` (default: the system's temporary directory), memory-mapped.
    ``on_rows``: called with each batch's whole label rows (every column), in key order,
    before the batch is yielded (a label database's values).
    """
    import numpy as np

    header = image_reader.header
    start = recipe.offset
    stop = check_range(image_reader.path, header.count, start, recipe.count)
    check_label_column(label_reader.header, recipe.label_column)
    selected = _select(image_reader, label_reader, start, stop, batch_size)
    if recipe.seed is None:
        for images, labels in selected:
            if on_rows is not None:
                on_rows(labels)
            yield _transform(images, recipe), _label_values(labels, recipe.label_column)
        return
    from mnist2db.storage.spill import spill_to_map

    count = stop - start
    rows, cols = header.dims[1], header.dims[2]
    label_parts: list[np.ndarray] = []

    def image_bytes() -> Iterator[bytes]:
        for images, labels in selected:
            label_parts.append(labels if on_rows is not None else
                               _label_values(labels, recipe.label_column))  # fmt: skip
            yield images.tobytes()

    pixels = spill_to_map(image_bytes(), count, rows * cols, spill_dir or _temp_dir())
    all_labels = np.concatenate(label_parts) if label_parts else np.zeros(0, dtype=np.int64)
    order = permutation(recipe.seed, count)
    for done in range(0, count, batch_size):
        chosen = order[done : done + batch_size]
        images = pixels[chosen].reshape(len(chosen), rows, cols)
        if on_rows is not None:
            on_rows(all_labels[chosen])
        yield _transform(images, recipe), _label_values(all_labels[chosen], recipe.label_column)


def _temp_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


def _transform(images: np.ndarray, recipe: Recipe) -> np.ndarray:
    import numpy as np

    if recipe.transpose:
        return np.ascontiguousarray(images.transpose(0, 2, 1))
    return images


def _select(
    image_reader: IdxReader, label_reader: IdxReader, start: int, stop: int, batch_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Items ``start … stop-1`` of both files, a batch at a time; reading stops at ``stop``."""
    done = 0
    if start == stop:
        return
    pairs = zip(
        image_reader.iter_batches(batch_size), label_reader.iter_batches(batch_size), strict=True
    )
    for images, labels in pairs:
        end = done + len(images)
        if end > start:
            lo, hi = max(start, done) - done, min(stop, end) - done
            yield images[lo:hi], labels[lo:hi]
        done = end
        if done >= stop:
            break
