"""What a conversion's options do to the source items, and the file that records them.

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

A database written with any option, and every siamese pair database, holds one more file,
:data:`METADATA_NAME`, beside the backend's own files and never among its records (Caffe's DataLayer reads every key of the
main database; LMDB and LevelDB both ignore a foreign file in their directory). It records
the options and the source, so ``verify`` and ``export`` map records back to source items
and ``info`` can say what the database holds. The permutation is not stored: the seed and
the method give it back. A pair database records its seed, pair count and balance
(:func:`pairs_metadata`) instead of conversion options: its records are pairs of source
items, so ``verify`` and ``export`` refuse it, and ``info`` shows how to make it again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from mnist2db.errors import IdxFormatError, Mnist2dbError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple
from mnist2db.formats.idx import QMNIST_LABELS_MAGIC

if TYPE_CHECKING:
    from typing import Any

    import numpy as np

    from mnist2db.formats.idx import IdxHeader
    from mnist2db.formats.idx_reader import IdxReader


class _RecipeFields(NamedTuple):
    transpose: bool = False
    label_column: int = 0
    offset: int = 0
    count: int | None = None  # type: ignore[assignment]  # the field hides tuple.count
    seed: int | None = None
    encoded: str | None = None


__all__ = [
    "METADATA_NAME",
    "Recipe",
    "check_range",
    "imageset_metadata",
    "iter_records",
    "pairs_metadata",
    "permutation",
    "read_metadata",
    "write_metadata",
]

#: The one file mnist2db adds to a database directory (see the module docstring).
METADATA_NAME = "mnist2db.json"
#: How the shuffled order is drawn from the seed (recorded, so that it can be checked).
SHUFFLE_METHOD = "argsort(PCG64(seed).random_raw(count))"
_FORMAT = "mnist2db database metadata"
_VERSION = 1


class Recipe(_RecipeFields):
    """The options of a conversion (immutable); all off gives Caffe's records.

    Fields: ``transpose``, ``label_column``, ``offset``, ``count`` (None: to the end),
    ``seed`` (None: source order), ``encoded`` (None: raw pixels, or ``"png"``).
    """

    __slots__ = ()

    @property
    def plain(self) -> bool:
        """True when no option changes what Caffe's convert_mnist_data would write."""
        return self == Recipe()


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
        raise Mnist2dbError(f"offset and count must not be negative, got {offset} and {count}")
    stop = total if count is None else offset + count
    if clip:
        if offset >= total:
            raise IdxFormatError(f"{path}: offset {offset} is past the end ({total} {unit})")
        return min(stop, total)
    if offset > total or stop > total:
        wanted = f"items {offset} … {stop - 1}" if stop > offset else f"offset {offset}"
        raise IdxFormatError(
            f"{path}: {wanted} do not fit: it holds {total} items (0 … {total - 1})"
            if total
            else f"{path}: {wanted} do not fit: it holds no items"
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


def permutation(seed: int, count: int) -> np.ndarray:
    """The shuffled order: record ``k`` holds selected item ``permutation(seed, count)[k]``."""
    import numpy as np

    if not 0 <= seed < 1 << 64:
        raise Mnist2dbError(f"seed must be between 0 and 2**64-1, got {seed}")
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
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The records ``recipe`` makes of a checked image/label pair, in key order.

    Yields ``(images, labels)``: uint8 ``(n, height, width)`` (transposed if asked) and the
    int64 Datum labels. A shuffle holds the selected images in an unlinked file in
    ``spill_dir`` (default: the system's temporary directory), memory-mapped.
    """
    import numpy as np

    header = image_reader.header
    start = recipe.offset
    stop = check_range(image_reader.path, header.count, start, recipe.count)
    check_label_column(label_reader.header, recipe.label_column)
    selected = _select(image_reader, label_reader, start, stop, batch_size)
    if recipe.seed is None:
        for images, labels in selected:
            yield _transform(images, recipe), _label_values(labels, recipe.label_column)
        return
    from mnist2db.storage.spill import spill_to_map

    count = stop - start
    rows, cols = header.dims[1], header.dims[2]
    label_parts: list[np.ndarray] = []

    def image_bytes() -> Iterator[bytes]:
        for images, labels in selected:
            label_parts.append(_label_values(labels, recipe.label_column))
            yield images.tobytes()

    pixels = spill_to_map(image_bytes(), count, rows * cols, spill_dir or _temp_dir())
    all_labels = np.concatenate(label_parts) if label_parts else np.zeros(0, dtype=np.int64)
    order = permutation(recipe.seed, count)
    for done in range(0, count, batch_size):
        chosen = order[done : done + batch_size]
        images = pixels[chosen].reshape(len(chosen), rows, cols)
        yield _transform(images, recipe), all_labels[chosen]


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


# -- the metadata file -------------------------------------------------------------------------


def _source(images: IdxHeader, labels: IdxHeader) -> dict[str, Any]:
    """The metadata's ``format``, ``version`` and ``source``: what every database records."""
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "source": {
            "images": os.fsdecode(images.path),
            "labels": os.fsdecode(labels.path),
            "items": images.count,
            "label_magic": f"0x{labels.magic:08x}",
        },
    }


def metadata_for(recipe: Recipe, images: IdxHeader, labels: IdxHeader) -> dict[str, Any]:
    """What :func:`write_metadata` records for a conversion of ``images`` and ``labels``."""
    stop = images.count if recipe.count is None else recipe.offset + recipe.count
    return {
        **_source(images, labels),
        "offset": recipe.offset,
        "count": stop - recipe.offset,
        "transpose": recipe.transpose,
        "label_column": recipe.label_column,
        "shuffle": None if recipe.seed is None else {"seed": recipe.seed, "method": SHUFFLE_METHOD},
        "encoded": recipe.encoded,
    }


def pairs_metadata(
    images: IdxHeader, labels: IdxHeader, *, seed: int, pairs: int, balanced: bool, method: str
) -> dict[str, Any]:
    """What :func:`write_metadata` records for a siamese pair database of ``images`` and
    ``labels`` (:mod:`mnist2db.siamese`, which names its draws' ``method``)."""
    return {
        **_source(images, labels),
        "pairs": {"count": pairs, "seed": seed, "balanced": balanced, "method": method},
    }


def imageset_metadata(
    *, root: str, listing: str, lines: int, options: dict[str, Any], seed: int | None
) -> dict[str, Any]:
    """What :func:`write_metadata` records for a database of image files
    (:mod:`mnist2db.imageset`): the root and list (or class folders), how the images
    were read (``options``: gray, resize, encode_type), and the shuffle's seed."""
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "source": {"images": root, "labels": listing, "items": lines},
        "imageset": {
            **options,
            "shuffle": None if seed is None else {"seed": seed, "method": SHUFFLE_METHOD},
        },
    }


def _imageset_lines(metadata: dict[str, Any]) -> list[tuple[str, str]] | None:
    """``info``'s lines on an image-file database, else None."""
    found = metadata.get("imageset")
    if found is None:
        return None
    shuffle = found.get("shuffle")
    read = "grey" if found.get("gray") else "colour (BGR)"
    if found.get("resize"):
        read += ", resized to {} × {}".format(*found["resize"])
    lines = [("images", read)]
    if found.get("encode_type"):
        lines.append(("encoded", f"{found['encode_type']} in Datum.data (encoded: true)"))
    order = (
        "list order"
        if shuffle is None
        else f"shuffled, seed {shuffle['seed']} ({shuffle['method']})"
    )
    lines.append(("order", order))
    return lines


def _pairs_of(metadata: dict[str, Any]) -> tuple[int, int, bool, str] | None:
    """``(count, seed, balanced, method)`` of a pair database's metadata, else None."""
    pairs = metadata.get("pairs")
    if pairs is None:
        return None
    return int(pairs["count"]), int(pairs["seed"]), bool(pairs["balanced"]), str(pairs["method"])


def write_metadata(directory: str, metadata: dict[str, Any], out: str) -> None:
    """Write :data:`METADATA_NAME` into the staging ``directory`` of the database ``out``
    (placed with it, flushed with it).

    Raises:
        BackendError: it cannot be written, naming ``out``.
    """
    import json

    from mnist2db.errors import BackendError

    text = json.dumps(metadata, indent=1) + "\n"
    try:
        with open(os.path.join(directory, METADATA_NAME), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise BackendError(f"{out}: cannot write {METADATA_NAME}: {exc.strerror or exc}") from None


def _load_metadata(db: str | os.PathLike[str]) -> tuple[str, dict[str, Any]] | None:
    """``(path, metadata)`` of database ``db``'s metadata file, or None if it has none.

    Raises:
        Mnist2dbError: the file is there but is not mnist2db's metadata.
    """
    import json

    path = os.path.join(os.fspath(db), METADATA_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Mnist2dbError(
            f"{path}: cannot read mnist2db's metadata: {exc.strerror or exc}"
        ) from None
    except json.JSONDecodeError as exc:
        raise Mnist2dbError(
            f"{path}: not mnist2db's metadata (not JSON: {exc.msg}, line {exc.lineno} "
            f"column {exc.colno})"
        ) from None
    except UnicodeDecodeError as exc:
        raise Mnist2dbError(
            f"{path}: not mnist2db's metadata (not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start})"
        ) from None
    try:
        if not isinstance(metadata, dict):
            raise ValueError("its JSON is not an object")
        if metadata["format"] != _FORMAT or metadata["version"] != _VERSION:
            raise ValueError("unknown format or version")
        int(metadata["source"]["items"])
        _pairs_of(metadata)
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_metadata(path, exc) from None
    return path, metadata


def _not_metadata(path: str, exc: Exception) -> Mnist2dbError:
    """The error for a metadata file that is not mnist2db's, in plain words."""
    if isinstance(exc, KeyError):
        return Mnist2dbError(f"{path}: not mnist2db's metadata (no field {exc})")
    if isinstance(exc, TypeError):
        return Mnist2dbError(f"{path}: not mnist2db's metadata (a field of the wrong type)")
    return Mnist2dbError(f"{path}: not mnist2db's metadata ({exc})")


def read_metadata(db: str | os.PathLike[str]) -> tuple[Recipe, dict[str, Any]] | None:
    """The recipe and metadata recorded in converted database ``db``, or None for a plain
    database.

    Raises:
        Mnist2dbError: the file is there but is not mnist2db's metadata, or ``db`` is a
            siamese pair database (its records are not source items).
    """
    loaded = _load_metadata(db)
    if loaded is None:
        return None
    path, metadata = loaded
    if "imageset" in metadata:
        raise Mnist2dbError(
            f"{os.fspath(db)}: a database of image files ({printable(metadata['source']['images'])}): "
            "its records are not items of IDX files"
        )
    pairs = _pairs_of(metadata)
    if pairs is not None:
        raise Mnist2dbError(
            f"{os.fspath(db)}: a siamese pair database ({pairs[0]} pairs, seed {pairs[1]}): "
            "its records are pairs of source items, not source items"
        )
    return _recipe_of(path, metadata), metadata


def _recipe_of(path: str, metadata: dict[str, Any]) -> Recipe:
    """The conversion options recorded in ``metadata`` (read from ``path``).

    Raises:
        Mnist2dbError: they are not mnist2db's.
    """
    try:
        shuffle = metadata["shuffle"]
        if shuffle is not None and shuffle["method"] != SHUFFLE_METHOD:
            raise ValueError(f"unknown shuffle method {shuffle['method']!r}")
        recipe = Recipe(
            transpose=bool(metadata["transpose"]),
            label_column=int(metadata["label_column"]),
            offset=int(metadata["offset"]),
            count=int(metadata["count"]),
            seed=None if shuffle is None else int(shuffle["seed"]),
            encoded=metadata.get("encoded"),
        )
        if recipe.encoded not in (None, "png"):
            raise ValueError(f"unknown encoding {recipe.encoded!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_metadata(path, exc) from None
    return recipe


def describe_db(db: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``info``'s lines on what a database holds of its source: ``(name, value)`` pairs.

    Raises:
        Mnist2dbError: its metadata file is not mnist2db's.
    """
    loaded = _load_metadata(db)
    if loaded is None:
        # Without it the database may be ours without options, or Caffe's, or anyone's:
        # its orientation, order and range are not known, so none is claimed.
        return [("options", f"not recorded (no {METADATA_NAME})")]
    source = loaded[1]["source"]
    items = int(source["items"])
    names = f"{printable(source['images'])} + {printable(source['labels'])}"
    imageset = _imageset_lines(loaded[1])
    if imageset is not None:
        return [("source", f"{names} ({items} images listed)"), *imageset]
    lines = [("source", f"{names} ({items} items)")]
    pairs = _pairs_of(loaded[1])
    if pairs is not None:
        count, seed, balanced, method = pairs
        kind = "balanced (half same-class)" if balanced else "uniform (as Caffe)"
        again = f"--seed {seed} --pairs {count}" + (" --balanced" if balanced else "")
        lines.append(("pairs", f"{count} {kind}, seed {seed} ({method})"))
        lines.append(("repeat", f"mnist2db siamese {again} IMAGES LABELS OUT_DB"))
        return lines
    recipe = _recipe_of(*loaded)
    if recipe.offset or recipe.count != items:
        lines.append(("items", f"{item_range(recipe)} of the source ({recipe.count})"))
    lines.append(("orientation", orientation(recipe.transpose)))
    if source["label_magic"] == f"0x{QMNIST_LABELS_MAGIC:08x}":
        lines.append(("label", f"column {recipe.label_column} of the idx2-int label rows"))
    lines.append(
        (
            "order",
            "source order"
            if recipe.seed is None
            else f"shuffled, seed {recipe.seed} ({SHUFFLE_METHOD})",
        )
    )
    if recipe.encoded is not None:
        lines.append(("encoded", f"{recipe.encoded.upper()} images in Datum.data (encoded: true)"))
    return lines


def item_range(recipe: Recipe) -> str:
    """The source items a recipe takes, as ``info`` and ``export`` name them:
    ``"100 … 1249"``, or ``"none, from 10000"`` for a count of 0."""
    if recipe.count == 0:
        return f"none, from {recipe.offset}"
    return f"{recipe.offset} … {recipe.offset + (recipe.count or 0) - 1}"


def orientation(transpose: bool) -> str:
    """How ``info`` and ``create`` name an orientation."""
    return "transposed (height and width swapped)" if transpose else "as the source stores it"
