"""What ``info`` says of an IDX file or a Datum database: header, sizes, storage, keys,
shape, encoding, label histogram, the options a database was written with. Everything
streams a chunk at a time; memory does not grow with the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from mnist2db.errors import DatumError, printable
from mnist2db.formats.datum.message import datum_shape, decode_datum, key_text, record_key
from mnist2db.formats.idx.header import (
    QMNIST_LABELS_MAGIC,
    magic_kind,
)
from mnist2db.formats.idx.scan import IdxScan, scan_idx
from mnist2db.formats.imdecode.image_file import image_format
from mnist2db.formats.imdecode.png_decoder import decode_datum_image
from mnist2db.formats.png.encoder import datum_encoding as _datum_encoding
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import (
    SHUFFLE_METHOD,
    imageset_lines,
    item_range,
    load_metadata,
    orientation,
    pairs_of,
    recipe_of,
)
from mnist2db.storage.databases.backends import DEFAULT_BATCH_SIZE as _BATCH
from mnist2db.storage.databases.backends import METADATA_NAME, detect_backend
from mnist2db.storage.databases.readers import DbReader, shared_reader


class IdxInfo(IdxScan):
    """What ``info`` reports on an IDX file: the fields of
    :class:`~mnist2db.formats.idx.reader.IdxScan` (declared there once), and their lines."""

    __slots__ = ()

    @property
    def expected_size(self) -> int:
        return self.header.header_size + self.header.payload_size

    @property
    def actual_size(self) -> int:
        return self.header.header_size + self.data_size

    @property
    def storage(self) -> str:
        """How the file is stored, as ``info`` shows it."""
        packing = self.header.packing
        if self.streaming:
            return f"{packing}, read from a pipe"
        return f"{packing}, {self.file_size} bytes{'' if packing == 'plain' else ' compressed'}"

    def rows(self) -> list[tuple[str, object]]:
        """``info``'s lines: ``(name, value)`` pairs, ``valid`` left to the caller."""
        header = self.header
        rows: list[tuple[str, object]] = [
            ("file", header.path),
            ("storage", self.storage),
            ("magic", f"0x{header.magic:08x} ({self.kind})"),
            ("type", header.type_name),
            ("dimensions", " × ".join(map(str, header.dims))),
            ("items", header.count),
            (
                "size",
                f"{self.expected_size} bytes expected, "
                f"{'at least ' if self.at_least else ''}{self.actual_size} found "
                f"(header {header.header_size} + data)",
            ),
        ]
        if self.label_counts is not None:
            rows += _count_rows(self.label_counts)
        return rows

    @property
    def kind(self) -> str:
        return magic_kind(self.header.magic)


def idx_info(path: str | os.PathLike[str]) -> IdxInfo:
    """Describe an IDX file: header, sizes, gzip or not, whether it is valid
    (:func:`mnist2db.formats.idx.scan.scan_idx` reads it).

    Raises:
        IdxFormatError: the file cannot be read or its header cannot be parsed at all.
    """
    return IdxInfo._make(scan_idx(path))


@dataclass
class DbInfo:
    """What ``info`` reports on a database."""

    path: str
    backend: str
    count: int
    first_key: bytes | None
    last_key: bytes | None
    sequential_keys: bool
    shape: tuple[int, int, int] | None
    encoding: str | None
    label_counts: dict[int, int] = field(default_factory=dict)
    disk_size: int = 0
    problem: str | None = None
    #: What the database holds of its source (orientation, order, range, label column).
    recipe: list[tuple[str, str]] = field(default_factory=list)
    #: For records of float_data (a label database): each value's (min, max) over all.
    value_ranges: list[tuple[float, float]] = field(default_factory=list)

    def rows(self) -> list[tuple[str, object]]:
        """``info``'s lines: ``(name, value)`` pairs, ``valid`` left to the caller."""
        rows: list[tuple[str, object]] = [
            ("database", self.path),
            ("backend", self.backend),
            ("records", self.count),
        ]
        if self.first_key is not None and self.last_key is not None:
            order = "Caffe's %08d sequence" if self.sequential_keys else "not Caffe's %08d sequence"
            rows.append(
                ("keys", f"{key_text(self.first_key)} … {key_text(self.last_key)} ({order})")
            )
        if self.shape is not None:
            shape = " × ".join(map(str, self.shape))
            rows.append(("datum", f"{shape} (channels × height × width), {self.encoding}"))
        return [
            *rows,
            *_range_rows(self.value_ranges),
            *_count_rows(self.label_counts),
            *self.recipe,
            ("size", f"{self.disk_size} bytes on disk"),
        ]


def _count_rows(counts: dict[int, int]) -> list[tuple[str, object]]:
    """A label histogram as ``info`` rows of at most five ``label: count`` entries."""
    entries = [f"{label}: {n}" for label, n in counts.items()]
    lines = ["  ".join(entries[i : i + 5]) for i in range(0, len(entries), 5)] or ["(none)"]
    return [("labels" if i == 0 else "", line) for i, line in enumerate(lines)]


#: The values whose ranges ``info`` lists (CelebA's 40 attributes fit).
_RANGES_SHOWN = 64


def _range_rows(ranges: list[tuple[float, float]]) -> list[tuple[str, object]]:
    """A float_data database's values, ``index: min … max``, four a line."""
    if not ranges:
        return []
    entries = [f"{i}: {low:.7g} … {high:.7g}" for i, (low, high) in enumerate(ranges)]
    more = len(entries) - _RANGES_SHOWN
    entries = entries[:_RANGES_SHOWN] + ([f"… and {more} more"] if more > 0 else [])
    lines = ["  ".join(entries[i : i + 4]) for i in range(0, len(entries), 4)]
    head: list[tuple[str, object]] = [
        ("values", f"{len(ranges)} float_data values a record; min … max of each:")
    ]
    return head + [("", line) for line in lines]


def _decoded_shape(image: np.ndarray) -> tuple[int, int, int]:
    channels, height, width = (int(side) for side in image.shape)
    return channels, height, width


def db_info(path: str | os.PathLike[str], progress: Progress | None = None) -> DbInfo:
    """Describe a database: backend, records, key range, Datum shape and encoding, labels.

    Reads every record once, in one read transaction (LMDB readers neither wait for nor
    block other readers or a writer). ``problem`` names the first record that does not fit.

    Raises:
        BackendError: the path is not a database of either backend, or cannot be opened.
    """
    # len() of a LevelDB database is a pass over it: counted only when watched.
    counted = progress is not None
    progress = reporting(progress)
    path = os.fsdecode(path)
    backend = detect_backend(path)
    info = DbInfo(path, backend, 0, None, None, True, None, None)
    counts: dict[int, int] = {}
    shapes: set[tuple[int, ...]] = set()
    kinds: set[str] = set()
    lows: np.ndarray | None = None
    highs: np.ndarray | None = None
    with shared_reader(path, backend) as reader:
        total = len(reader) if counted else 0
        count = 0
        key = b""
        for key, value in reader:
            if count == 0:
                info.first_key = bytes(key)
            if info.sequential_keys and key != record_key(count):
                info.sequential_keys = False
            count += 1
            if info.problem is not None:
                continue
            where = f"key {key_text(bytes(key))}"
            try:
                datum = decode_datum(bytes(value))
                # Every record as a reader sees it: an encoded image decoded (its header,
                # chunks and size checked first), a raw one's shape and data checked.
                shape = (
                    _decoded_shape(decode_datum_image(datum.data, where))
                    if datum.encoded
                    else datum_shape(datum, where)
                )
            except DatumError as exc:
                text = str(exc)
                info.problem = text if text.startswith(where) else f"{where}: {text}"
                continue
            encoding = _datum_encoding(datum)
            if info.shape is None:
                info.shape, info.encoding = shape, encoding
                if datum.encoded:
                    kinds.add(image_format(datum.data) or "unknown")
            elif datum.encoded and info.encoding and "encoded" in info.encoding:
                # convert_imageset writes images of any size and type (JPEG and PNG mixed).
                shapes.add(shape)
                kinds.add(image_format(datum.data) or "unknown")
            elif shape != info.shape or encoding != info.encoding:
                info.problem = (
                    f"key {key_text(bytes(key))}: Datum {'×'.join(map(str, shape))} "
                    f"{encoding}, the first record is {'×'.join(map(str, info.shape))} "
                    f"{info.encoding}"
                )
            counts[int(datum.label)] = counts.get(int(datum.label), 0) + 1
            if not datum.encoded and not datum.data and len(datum.float_data):
                values = np.array(datum.float_data, np.float32)
                if lows is None or highs is None:
                    lows, highs = values.copy(), values.copy()
                elif len(values) == len(lows):  # another length is a problem named above
                    np.minimum(lows, values, out=lows)
                    np.maximum(highs, values, out=highs)
            if count % _BATCH == 0:
                progress(count, total)
        info.last_key = bytes(key) if count else None
        # Through the reader: the options of the records just read, not of a database
        # that replaced them meanwhile.
        info.recipe = describe_db(reader)
    if info.encoding and (shapes - {info.shape} or len(kinds) > 1):
        info.encoding += f"; {len(shapes | {info.shape})} sizes, {' and '.join(sorted(kinds))}"
    info.count = count
    # Measured after closing: opening a LevelDB database may rewrite its log into a table.
    info.disk_size = sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name))
    )
    info.label_counts = dict(sorted(counts.items()))
    if lows is not None and highs is not None:
        info.value_ranges = list(zip(lows.tolist(), highs.tolist(), strict=True))
    progress(count, total)
    return info


def describe_db(db: DbReader | str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``info``'s lines on what a database holds of its source: ``(name, value)`` pairs.

    Raises:
        Mnist2dbError: its metadata file is not mnist2db's.
    """
    loaded = load_metadata(db)
    if loaded is None:
        # Without it the database may be ours without options, or Caffe's, or anyone's:
        # its orientation, order and range are not known, so none is claimed.
        return [("options", f"not recorded (no {METADATA_NAME})")]
    if "source" not in loaded[1]:  # written without options: the records' digest alone
        return [("options", f"not recorded ({METADATA_NAME} holds the records' digest alone)")]
    source = loaded[1]["source"]
    items = source["items"]
    names = f"{printable(source['images'])} + {printable(source['labels'])}"
    imageset = imageset_lines(loaded[1])
    if imageset is not None:
        return [("source", f"{names} ({items} images listed)"), *imageset]
    lines = [("source", f"{names} ({items} items)")]
    pairs = pairs_of(loaded[1])
    if pairs is not None:
        count, seed, balanced, method = pairs
        kind = "balanced (half same-class)" if balanced else "uniform (as Caffe)"
        again = f"--seed {seed} --pairs {count}" + (" --balanced" if balanced else "")
        lines.append(("pairs", f"{count} {kind}, seed {seed} ({method})"))
        lines.append(("repeat", f"mnist2db siamese {again} IMAGES LABELS OUT_DB"))
        return lines
    recipe = recipe_of(*loaded)
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
        lines.append(
            (
                "encoded",
                f"{recipe.encoded.upper()} images in Datum.data (encoded: true), "
                f"--png-compression {recipe.png_compression}",
            )
        )
    return lines


def describe(path: str | os.PathLike[str], progress: Progress | None = None) -> IdxInfo | DbInfo:
    """What ``mnist2db info PATH`` reports: a database directory's :class:`DbInfo`, else an
    IDX file's :class:`IdxInfo`. Neither raises for what is wrong inside: ``problem`` says
    it (None: valid), and ``rows()`` gives ``info``'s lines.

    Raises:
        IdxFormatError: an IDX file cannot be read, or its header cannot be parsed at all.
        BackendError: a directory that is not a database, or that cannot be opened.
    """
    return db_info(path, progress) if os.path.isdir(path) else idx_info(path)
