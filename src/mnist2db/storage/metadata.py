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

Every database mnist2db writes records a digest of its records
(:class:`~mnist2db.storage.record_digest.RecordDigest`,
computed by the one batch writer, :func:`mnist2db.conversion.write_database`, as the
records are written), in this file's ``digest`` field; a database written without
options holds a file of the digest alone. ``verify DB`` reads the records again and
compares: LMDB keeps no checksum of its own, so this is what finds a changed byte.
"""

from __future__ import annotations

import os

from mnist2db.errors import Mnist2dbError, OutputError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.png import OLD_PNG_COMPRESSION, PNG_COMPRESSIONS
from mnist2db.storage.record_digest import DIGEST_METHOD, RecordDigest

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from mnist2db.formats.idx import IdxHeader
    from mnist2db.storage.readers import DbReader


#: The one file mnist2db adds to a database directory (see the module docstring).
METADATA_NAME = "mnist2db.json"
#: How the shuffled order is drawn from the seed (recorded, so that it can be checked).
SHUFFLE_METHOD = "argsort(PCG64(seed).random_raw(count))"
_FORMAT = "mnist2db database metadata"
_VERSION = 1
#: The largest metadata file read: mnist2db's are a few hundred bytes (two paths and a
#: dozen fields); anything larger is not one.
METADATA_LIMIT = 1 << 16
#: The most JSON text of a label database's column names recorded (CelebA's 40 take 520).
NAMES_LIMIT = 1 << 15


def write_digest(directory: str, digest: RecordDigest, out: str) -> None:
    """Write :data:`METADATA_NAME` holding the records' ``digest`` alone into the staging
    ``directory`` of the database ``out``; :func:`write_metadata` keeps it.

    Raises:
        OutputError: it cannot be written, naming ``out``.
    """
    fields = digest.fields()
    if fields is not None:
        write_metadata(directory, {"format": _FORMAT, "version": _VERSION, "digest": fields}, out)


def write_target_names(directory: str, names: Sequence[str], out: str) -> None:
    """Record a label database's column names (its label table's header) in the
    :data:`METADATA_NAME` of its staging ``directory``, beside the records' digest: what
    ``export --label-db`` names the targets by. Nothing is written for a table without
    names, nor for names longer in all than :data:`NAMES_LIMIT` (the file stays one
    :data:`METADATA_LIMIT` can read; export then names the columns ``v0`` …).

    Raises:
        OutputError: it cannot be written, naming ``out``.
    """
    import json

    if not names or len(json.dumps(list(names))) > NAMES_LIMIT:
        return
    fields = {"format": _FORMAT, "version": _VERSION, "targets": {"names": list(names)}}
    write_metadata(directory, fields, out)


def target_names(metadata: dict[str, Any]) -> list[str] | None:
    """The column names checked metadata records for a label database's values, or None."""
    targets = metadata.get("targets")
    return None if targets is None else list(targets["names"])


def digest_of(metadata: dict[str, Any]) -> tuple[int, str] | None:
    """``(records, sha256)`` of checked metadata's digest, or None if it records none."""
    digest = metadata.get("digest")
    return None if digest is None else (digest["records"], digest["sha256"])


@named_tuple
class Recipe(NamedTuple):
    """The options of a conversion (immutable); all off gives Caffe's records.

    Fields: ``transpose``, ``label_column``, ``offset``, ``count`` (None: to the end),
    ``seed`` (None: source order), ``encoded`` (None: raw pixels, or ``"png"``),
    ``png_compression`` (of ``"png"`` records: ``"fast"`` or ``"small"``; None otherwise).
    """

    transpose: bool = False
    label_column: int = 0
    offset: int = 0
    count: int | None = None  # type: ignore[assignment]  # the field hides tuple.count
    seed: int | None = None
    encoded: str | None = None
    png_compression: str | None = None

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
        **({} if recipe.encoded is None else {"png_compression": recipe.png_compression}),
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
    (:mod:`mnist2db.images.datum_records`): the root and list (or class folders), how the images
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


def write_metadata(directory: str, metadata: dict[str, Any], out: str) -> None:
    """Write :data:`METADATA_NAME` into the staging ``directory`` of the database ``out``
    (placed with it, flushed with it).

    Raises:
        OutputError: it cannot be written, naming ``out``.
    """
    import json

    target = os.path.join(directory, METADATA_NAME)
    if "digest" not in metadata:  # the records' digest, written with them: kept
        try:
            with open(target, "rb") as f:
                written = json.loads(f.read(METADATA_LIMIT))
        except (OSError, ValueError):
            written = None
        if isinstance(written, dict) and isinstance(written.get("digest"), dict):
            metadata = {**metadata, "digest": written["digest"]}
    text = json.dumps(metadata, indent=1) + "\n"
    try:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write {METADATA_NAME}: {exc.strerror or exc}") from None


def load_metadata(db: DbReader | str | os.PathLike[str]) -> tuple[str, dict[str, Any]] | None:
    """``(path, metadata)`` of a database's metadata file, or None if it has none.

    Read through the reader ``db`` (or one opened on the path ``db``), from the directory
    whose records it reads: one version of the database, or an error (see
    :mod:`mnist2db.storage.readers`). Only a regular file of at most
    :data:`METADATA_LIMIT` bytes is read, opened non-blocking; its JSON must be exactly
    what mnist2db writes, every field of its type.

    Raises:
        Mnist2dbError: the file is there but is not mnist2db's metadata (one line naming
            it and what is wrong).
        BackendError: no database at the path, or it was replaced as it was being read.
    """
    from mnist2db.storage.readers import DbReader  # the readers are off convert's fast path

    if not isinstance(db, DbReader):
        with DbReader(db) as reader:
            return load_metadata(reader)
    path = os.path.join(db.path, METADATA_NAME)
    data = db.read_file(METADATA_NAME, METADATA_LIMIT, "mnist2db's metadata")
    if data is None:
        # None may also be a replaced database's file being removed: its records (already
        # open) would be read without their options. The path still names it, or an error.
        db.check_current()
        return None
    metadata = _parse(data, path)
    try:
        _check_fields(metadata)
    except _Invalid as exc:
        raise Mnist2dbError(f"{path}: not mnist2db's metadata ({exc})") from None
    return path, metadata


def _parse(data: bytes, path: str) -> Any:
    import json

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse)
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    except json.JSONDecodeError as exc:
        why = f"not JSON: {exc.msg}, line {exc.lineno} column {exc.colno}"
    except RecursionError:
        why = "not JSON mnist2db writes: nested too deeply"
    except ValueError as exc:  # a constant refused above, or a number of too many digits
        why = f"not JSON: {' '.join(str(exc).split())}"
    raise Mnist2dbError(f"{path}: not mnist2db's metadata ({why})")


class _Invalid(Exception):
    """A field that is missing or not of its type (the message says which)."""


def _shown(value: Any) -> str:
    import json

    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = json.dumps(value)
        return f"the string {text if len(text) <= 40 else text[:36] + '…' + text[-1]}"
    return "a list" if isinstance(value, list) else "an object"


def _whole(low: int, high: int | None = None) -> Callable[[Any], bool]:
    """A JSON integer (not true/false, not 1.0) from ``low`` to ``high``."""
    return lambda v: type(v) is int and v >= low and (high is None or v <= high)


_COUNT = ("a whole number, 0 or more", _whole(0))
_SEED = ("a seed, a whole number from 0 to 2^64-1", _whole(0, 2**64 - 1))
_BOOL = ("true or false", lambda v: type(v) is bool)
_TEXT = ("a string", lambda v: type(v) is str)
_OBJECT = ("an object", lambda v: type(v) is dict)
_NAMES = ("a list of names", lambda v: type(v) is list and len(v) > 0
          and all(type(n) is str for n in v))  # fmt: skip


def _field(obj: dict[str, Any], name: str, kind: tuple[str, Callable[[Any], bool]]) -> Any:
    """``obj[name]`` if it is of ``kind`` (its words, its test); names the field if not."""
    short = name.rpartition(".")[2]
    if short not in obj:
        raise _Invalid(f"no field '{name}'")
    value = obj[short]
    if not kind[1](value):
        raise _Invalid(f"field '{name}' is {_shown(value)}, expected {kind[0]}")
    return value


def _check_fields(metadata: Any) -> None:
    """Check every field mnist2db reads, and its type, before any is used."""
    import re

    if type(metadata) is not dict:
        raise _Invalid("its JSON is not an object")
    if (_field(metadata, "format", _TEXT), _field(metadata, "version", _COUNT)) != (
        _FORMAT,
        _VERSION,
    ):
        raise _Invalid("unknown format or version")
    if metadata.get("digest") is not None:
        digest = _field(metadata, "digest", _OBJECT)
        _field(digest, "digest.records", _COUNT)
        hexdigest = ("64 hex digits", lambda v: type(v) is str
                     and re.fullmatch(r"[0-9a-f]{64}", v) is not None)  # fmt: skip
        _field(digest, "digest.sha256", hexdigest)
        if _field(digest, "digest.method", _TEXT) != DIGEST_METHOD:
            raise _Invalid(f"unknown digest method {digest['method']!r}")
    if metadata.get("targets") is not None:  # a label database's column names
        targets = _field(metadata, "targets", _OBJECT)
        _field(targets, "targets.names", _NAMES)
    recorded = (metadata.get(name) is not None for name in ("digest", "targets"))
    if "source" not in metadata and any(recorded):
        return  # a database written without options: its digest, its column names
    source = _field(metadata, "source", _OBJECT)
    for name in ("images", "labels"):
        _field(source, f"source.{name}", _TEXT)
    items = _field(source, "source.items", _COUNT)
    if metadata.get("imageset") is not None:  # image files: no IDX source, no recipe
        found = _field(metadata, "imageset", _OBJECT)
        _field(found, "imageset.gray", _BOOL)
        shuffle = _field(
            found, "imageset.shuffle", ("an object or null", lambda v: v is None or type(v) is dict)
        )
        if shuffle is not None:
            _field(shuffle, "imageset.shuffle.seed", _SEED)
            _field(shuffle, "imageset.shuffle.method", _TEXT)
        return
    magic = ("a magic number, '0x' and 8 hex digits", lambda v: type(v) is str
             and re.fullmatch(r"0x[0-9a-f]{8}", v) is not None)  # fmt: skip
    _field(source, "source.label_magic", magic)
    if metadata.get("pairs") is not None:
        pairs = _field(metadata, "pairs", _OBJECT)
        _field(pairs, "pairs.count", _COUNT)
        _field(pairs, "pairs.seed", _SEED)
        _field(pairs, "pairs.balanced", _BOOL)
        _field(pairs, "pairs.method", _TEXT)
        return
    offset = _field(metadata, "offset", _COUNT)
    count = _field(metadata, "count", _COUNT)
    if offset + count > items:
        raise _Invalid(f"items {offset} … {offset + count - 1} are past the source's {items}")
    _field(metadata, "transpose", _BOOL)
    _field(metadata, "label_column", _COUNT)
    shuffle = _field(
        metadata, "shuffle", ("an object or null", lambda v: v is None or type(v) is dict)
    )
    if shuffle is not None:
        _field(shuffle, "shuffle.seed", _SEED)
        if _field(shuffle, "shuffle.method", _TEXT) != SHUFFLE_METHOD:
            raise _Invalid(f"unknown shuffle method {shuffle['method']!r}")
    if metadata.get("encoded") not in (None, "png"):
        raise _Invalid(f"unknown encoding {_shown(metadata['encoded'])}")
    if metadata.get("png_compression") not in (None, *PNG_COMPRESSIONS):
        raise _Invalid(f"unknown PNG compression {_shown(metadata['png_compression'])}")


def pairs_of(metadata: dict[str, Any]) -> tuple[int, int, bool, str] | None:
    """``(count, seed, balanced, method)`` of a pair database's checked metadata, else None."""
    pairs = metadata.get("pairs")
    if pairs is None:
        return None
    return pairs["count"], pairs["seed"], pairs["balanced"], pairs["method"]


def read_metadata(
    db: DbReader | str | os.PathLike[str],
) -> tuple[Recipe, dict[str, Any]] | None:
    """The recipe and metadata recorded in converted database ``db`` (a reader of it, or
    its path), or None for a plain database.

    Raises:
        Mnist2dbError: the file is there but is not mnist2db's metadata, or ``db`` is a
            siamese pair database (its records are not source items).
    """
    loaded = load_metadata(db)
    if loaded is None or "source" not in loaded[1]:  # none, or the records' digest alone
        return None
    path, metadata = loaded
    if "imageset" in metadata:
        raise Mnist2dbError(
            f"{os.path.dirname(path)}: a database of image files "
            f"({printable(str(metadata['source']['images']))}): its records are not items "
            "of IDX files"
        )
    pairs = pairs_of(metadata)
    if pairs is not None:
        name = os.path.dirname(path)
        raise Mnist2dbError(
            f"{name}: a siamese pair database ({pairs[0]} pairs, seed {pairs[1]}): "
            "its records are pairs of source items, not source items"
        )
    return recipe_of(path, metadata), metadata


def recipe_of(path: str, metadata: dict[str, Any]) -> Recipe:
    """The conversion options recorded in ``metadata`` (read from ``path`` and checked by
    :func:`load_metadata`)."""
    shuffle = metadata["shuffle"]
    encoded = metadata.get("encoded")
    compression = metadata.get("png_compression")
    if encoded is not None and compression is None:  # written before the choice existed
        compression = OLD_PNG_COMPRESSION
    return Recipe(
        transpose=metadata["transpose"],
        label_column=metadata["label_column"],
        offset=metadata["offset"],
        count=metadata["count"],
        seed=None if shuffle is None else shuffle["seed"],
        encoded=encoded,
        png_compression=None if encoded is None else compression,
    )


def item_range(recipe: Recipe) -> str:
    """The source items a recipe takes, as ``info`` and ``export`` name them:
    ``"100 … 1249"``, or ``"none, from 10000"`` for a count of 0."""
    if recipe.count == 0:
        return f"none, from {recipe.offset}"
    return f"{recipe.offset} … {recipe.offset + (recipe.count or 0) - 1}"


def orientation(transpose: bool) -> str:
    """How ``info`` and ``create`` name an orientation."""
    return "transposed (height and width swapped)" if transpose else "as the source stores it"
