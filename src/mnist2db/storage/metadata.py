"""``mnist2db.json``: the file that records how a database was made, and the options it records.

A database written with any option, and every siamese pair database, holds one more file,
:data:`METADATA_NAME`, beside the backend's own files and never among its records (Caffe's
DataLayer reads every key of the main database; LMDB and LevelDB both ignore a foreign file
in their directory). It records the options (:class:`Recipe`) and the source, so ``verify``
and ``export`` map records back to source items and ``info`` can say what the database
holds. The permutation is not stored: the seed and the method give it back
(:func:`mnist2db.records.permutation`). A pair database records its seed, pair count and
balance (:func:`pairs_metadata`) instead of conversion options: its records are pairs of
source items, so ``verify`` and ``export`` refuse it, and ``info`` shows how to make it again.
"""

from __future__ import annotations

import os

from mnist2db.errors import Mnist2dbError, OutputError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

    from mnist2db.formats.idx import IdxHeader


class _RecipeFields(NamedTuple):
    transpose: bool = False
    label_column: int = 0
    offset: int = 0
    count: int | None = None  # type: ignore[assignment]  # the field hides tuple.count
    seed: int | None = None
    encoded: str | None = None


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
    were read (``options``: gray, resize, encode_type, check_size), the shuffle's seed."""
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "source": {"images": root, "labels": listing, "items": lines},
        "imageset": {
            **options,
            "shuffle": None if seed is None else {"seed": seed, "method": SHUFFLE_METHOD},
        },
    }


def imageset_lines(metadata: dict[str, Any]) -> list[tuple[str, str]] | None:
    """``info``'s lines on a database of image files, else None."""
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


def pairs_of(metadata: dict[str, Any]) -> tuple[int, int, bool, str] | None:
    """``(count, seed, balanced, method)`` of a pair database's metadata, else None."""
    pairs = metadata.get("pairs")
    if pairs is None:
        return None
    return int(pairs["count"]), int(pairs["seed"]), bool(pairs["balanced"]), str(pairs["method"])


def write_metadata(directory: str, metadata: dict[str, Any], out: str) -> None:
    """Write :data:`METADATA_NAME` into the staging ``directory`` of the database ``out``
    (placed with it, flushed with it).

    Raises:
        OutputError: it cannot be written, naming ``out``.
    """
    import json

    text = json.dumps(metadata, indent=1) + "\n"
    try:
        with open(os.path.join(directory, METADATA_NAME), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write {METADATA_NAME}: {exc.strerror or exc}") from None


def load_metadata(db: str | os.PathLike[str]) -> tuple[str, dict[str, Any]] | None:
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
        pairs_of(metadata)
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
    loaded = load_metadata(db)
    if loaded is None:
        return None
    path, metadata = loaded
    if "imageset" in metadata:
        raise Mnist2dbError(
            f"{os.fspath(db)}: a database of image files "
            f"({printable(str(metadata['source']['images']))}): its records are not items "
            "of IDX files"
        )
    pairs = pairs_of(metadata)
    if pairs is not None:
        raise Mnist2dbError(
            f"{os.fspath(db)}: a siamese pair database ({pairs[0]} pairs, seed {pairs[1]}): "
            "its records are pairs of source items, not source items"
        )
    return recipe_of(path, metadata), metadata


def recipe_of(path: str, metadata: dict[str, Any]) -> Recipe:
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


def item_range(recipe: Recipe) -> str:
    """The source items a recipe takes, as ``info`` and ``export`` name them:
    ``"100 … 1249"``, or ``"none, from 10000"`` for a count of 0."""
    if recipe.count == 0:
        return f"none, from {recipe.offset}"
    return f"{recipe.offset} … {recipe.offset + (recipe.count or 0) - 1}"


def orientation(transpose: bool) -> str:
    """How ``info`` and ``create`` name an orientation."""
    return "transposed (height and width swapped)" if transpose else "as the source stores it"
