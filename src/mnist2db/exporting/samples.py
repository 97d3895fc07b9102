"""One database record as the file an export writes: its bytes, its extension, its name.

* An encoded record (``Datum.encoded``: what ``convert_imageset --encoded`` and
  ``convert --encoded png`` store) is written as its stored bytes, never decoded nor
  re-encoded; the extension comes from the bytes' signature (:data:`EXTENSIONS`).
* A raw record becomes a lossless PNG: 1 channel grey, 3 channels colour, Caffe's BGR
  stored as the PNG's RGB, so ``cv::imread`` (BGR) and Pillow (RGB) give back the record's
  pixels. Other channel counts and ``float_data`` records are not images: refused in one line.

Names: a key ``convert_imageset`` wrote (``%08d_PATH``) gives back ``PATH`` when it is a
safe relative path (:func:`caffe_path`); any other key is used as a file name when it is a
plain one, else mapped to a safe name that keeps a readable part and a digest of the key
(:func:`file_stem`, :func:`sample_key`: a WebDataset sample key has no dot).

A database's samples are made a batch at a time by :mod:`mnist2db.exporting.sample_batches`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from mnist2db.errors import DatumError
from mnist2db.formats.datum.message import check_datum, decode_datum, key_text
from mnist2db.formats.imdecode.image_file import image_format

#: The extension written for each format :func:`mnist2db.formats.imread.reader.image_format` names.
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "BMP": "bmp", "TIFF": "tif", "WEBP": "webp"}
#: PNM's magic digit -> extension (PBM, PGM, PPM).
_PNM = {"1": "pbm", "4": "pbm", "2": "pgm", "5": "pgm", "3": "ppm", "6": "ppm"}
#: The extension of encoded bytes of no format OpenCV reads (kept as they are).
UNKNOWN_EXTENSION = "bin"
#: The longest restored path (bytes) and path component; longer ones are mapped.
PATH_LIMIT = 1024
NAME_LIMIT = 200

_CAFFE_KEY = re.compile(rb"[0-9]{8,}_(.+)", re.DOTALL)
_PLAIN_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.+=,@-]{0,127}")
_PLAIN_SAMPLE = re.compile(r"[A-Za-z0-9_-]{1,90}")
#: Plain sample keys, one a line (:func:`plain_sample_keys`).
_PLAIN_SAMPLES = re.compile(rb"[A-Za-z0-9_-]{1,90}(?:\n[A-Za-z0-9_-]{1,90})*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class Sample(NamedTuple):
    """A record as a file: ``key`` (the database's), ``label``, ``data`` (the file's bytes),
    ``ext`` (its extension, without the dot), ``encoded`` (the stored bytes as they are;
    False: a PNG of raw pixels)."""

    key: bytes
    label: int
    data: bytes | memoryview
    ext: str
    encoded: bool


def extension(data: bytes | memoryview) -> str:
    """The extension of encoded image bytes, from their signature (``bin`` when unknown)."""
    kind = image_format(bytes(data[:12]))
    if kind == "PPM":
        return _PNM.get(chr(data[1]), "ppm")
    return EXTENSIONS.get(kind or "", UNKNOWN_EXTENSION)


def read_record(db_path: str, key: bytes, value: bytes) -> Any:
    """The Datum of one record, parsed and checked; a bad one refused naming the key.

    Raises:
        DatumError: ``db_path: key KEY: what is wrong``.
    """
    where = f"{db_path}: key {key_text(key)}"
    try:
        datum = decode_datum(value)
        check_datum(datum, where)
    except DatumError as exc:
        text = str(exc)
        raise DatumError(text if text.startswith(where) else f"{where}: {text}") from None
    return datum


class SampleBatch(NamedTuple):
    """Consecutive samples, as columns: ``keys``, ``labels``, ``data`` (the files' bytes),
    ``exts``; ``encoded``: all stored bytes as they are, or all PNGs of raw pixels."""

    keys: list[bytes]
    labels: list[int]
    data: list[bytes | memoryview]
    exts: list[str]
    encoded: bool

    def samples(self) -> Iterator[Sample]:
        for key, label, data, ext in zip(self.keys, self.labels, self.data, self.exts,
                                         strict=True):  # fmt: skip
            yield Sample(key, label, data, ext, self.encoded)


# -- names ---------------------------------------------------------------------------------


def caffe_path(key: bytes, reserved: Iterable[str] = ()) -> str | None:
    """The relative path a ``convert_imageset`` key (``%08d_PATH``) names, when safe to
    restore under the output: UTF-8, printable, relative, no empty, ``.`` or ``..`` part,
    at most :data:`PATH_LIMIT` bytes and :data:`NAME_LIMIT` a part, not beginning with one
    of ``reserved`` (the export's own files). None otherwise (or not such a key)."""
    match = _CAFFE_KEY.fullmatch(key)
    if match is None:
        return None
    raw = match.group(1)
    if len(raw) > PATH_LIMIT:
        return None
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not path.isprintable() or path.startswith("/"):
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") or len(p.encode()) > NAME_LIMIT for p in parts):
        return None
    if parts[0] in reserved:
        return None
    return path


def _mapped(text: str, key: bytes) -> str:
    readable = _UNSAFE.sub("_", text)[:64].strip("_") or "key"
    return f"{readable}_{hashlib.sha256(key).hexdigest()[:12]}"


def file_stem(key: bytes) -> tuple[str, bool]:
    """A file name (without extension) for ``key``: the key itself when a plain name
    (ASCII letters, digits, ``_-.+=,@``, not beginning with a dot, ≤ 128 characters), else a
    mapped one; and whether it was mapped."""
    text = key.decode("ascii", errors="replace")
    if _PLAIN_FILE.fullmatch(text):
        return text, False
    return _mapped(text, key), True


def sample_key(key: bytes) -> tuple[str, bool]:
    """A WebDataset sample key for ``key`` (no dot, no ``/``: a loader cuts a member's name
    at its first dot): the key itself when plain (ASCII letters, digits, ``_-``, ≤ 90),
    else a mapped one; and whether it was mapped."""
    text = key.decode("ascii", errors="replace")
    if _PLAIN_SAMPLE.fullmatch(text):
        return text, False
    return _mapped(text, key), True


def plain_sample_keys(keys: list[bytes]) -> bool:
    """True when every key is a plain sample key (:func:`sample_key` keeps it as it is),
    checked in one match of them all."""
    return _PLAIN_SAMPLES.fullmatch(b"\n".join(keys)) is not None


def key_fields(key: bytes) -> dict[str, str]:
    """The source key as JSON holds it: ``{"key": text}``, or ``{"key_hex": ...}`` when it
    is not UTF-8."""
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {"key_hex": key.hex()}


#: The largest class-name file read (one name a line).
CLASSES_LIMIT = 1 << 20


def read_class_names(path: str) -> tuple[str, ...]:
    """The class names of a ``classes.txt`` (one a line, in label order: what ``imageset``
    writes beside a database made from class folders, ``DB.classes.txt``).

    Raises:
        DatumError: the file cannot be read, is larger than :data:`CLASSES_LIMIT`, or is not UTF-8.
    """
    try:
        with open(path, "rb") as stream:
            data = stream.read(CLASSES_LIMIT + 1)
    except OSError as exc:
        raise DatumError(f"{path}: cannot read the class names: {exc.strerror}") from None
    if len(data) > CLASSES_LIMIT:
        raise DatumError(f"{path}: more than {CLASSES_LIMIT} bytes: not a list of class names")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DatumError(f"{path}: class names are not UTF-8 text") from None
    return tuple(text.splitlines())


def class_names(
    db_path: str, classes: str | os.PathLike[str] | None
) -> tuple[tuple[str, ...], str | None]:
    """The class names of ``db_path``'s labels and the file they come from: ``classes``, else
    the ``DB.classes.txt`` beside the database (``imageset``'s), else none."""
    path = os.fsdecode(classes) if classes is not None else None
    beside = os.path.normpath(db_path) + ".classes.txt"
    if path is None and os.path.isfile(beside):
        path = beside
    return (read_class_names(path) if path is not None else ()), path
