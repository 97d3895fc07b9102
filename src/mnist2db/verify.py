"""``verify``: check that a database holds exactly the records its sources give.

A database written with options (:mod:`mnist2db.recipe`) is compared with what those
options make of the source, as recorded in its ``mnist2db.json``: the range, the order
(the permutation is drawn again from the recorded seed), the orientation and the label
column. Everything streams a batch at a time (a shuffle spills the selected images to an
unlinked temporary file, memory-mapped).

Without sources, ``verify DB`` reads every record and compares their digest with the one
mnist2db recorded when it wrote them (``mnist2db.json``'s ``digest``): any byte changed,
record lost or added since is found (LMDB keeps no checksums of its own). A database
written by Caffe or another tool records none, and is said to.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from mnist2db.errors import DatumError, VerifyError
from mnist2db.formats.datum.message import decode_datum, encode_batch, key_text, record_key
from mnist2db.formats.idx.header import check_pair
from mnist2db.formats.idx.reader import open_idx
from mnist2db.formats.imdecode.png_decoder import decode_datum_image, decoded_datum
from mnist2db.formats.png.encoder import OLD_PNG_COMPRESSION, encode_png_batch
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import Recipe, digest_of, load_metadata, read_metadata
from mnist2db.selection import iter_records, permutation
from mnist2db.storage.databases.backends import DEFAULT_BATCH_SIZE as _BATCH
from mnist2db.storage.databases.backends import METADATA_NAME
from mnist2db.storage.databases.readers import DbReader, shared_reader
from mnist2db.storage.record_digest import digest_items


@dataclass(frozen=True)
class VerifyResult:
    count: int
    rows: int
    cols: int


def _same_decoded(value: bytes, image: np.ndarray, label: int) -> bool:
    """True when ``value`` is an encoded Datum whose image decodes to ``image`` (1 channel)
    and whose label is ``label``: PNG bytes depend on the encoder, the pixels do not."""
    try:
        datum = decode_datum(value)
        if not datum.encoded:
            return False
        pixels = decode_datum_image(datum.data, "")
    except DatumError:
        return False
    return (
        int(datum.label) == label
        and pixels.shape == (1, *image.shape)
        and bytes(pixels.data) == image.tobytes()
    )


def _describe_mismatch(key: bytes, value: bytes, image: np.ndarray, label: int) -> str:
    """Name the first field in which ``value`` differs from the Datum Caffe writes (an
    encoded Datum's image decoded first)."""
    where = f"key {key_text(key)}"
    try:
        datum = decoded_datum(decode_datum(value), where)
    except DatumError as exc:
        text = str(exc)  # the decoder names the key already; decode_datum does not
        return text if text.startswith(where) else f"{where}: {text}"
    rows, cols = image.shape
    for name, got, want in (
        ("channels", datum.channels, 1),
        ("height", datum.height, rows),
        ("width", datum.width, cols),
    ):
        if got != want:
            return f"key {key_text(key)}: field {name} is {got}, the source has {want}"
    expected = image.tobytes()
    data = bytes(datum.data)
    if len(data) != len(expected):
        return (
            f"key {key_text(key)}: field data holds {len(data)} bytes, "
            f"the source image has {len(expected)}"
        )
    if data != expected:
        diffs = [i for i in range(len(data)) if data[i] != expected[i]]
        row, col = divmod(diffs[0], cols)
        more = f" ({len(diffs)} bytes differ)" if len(diffs) > 1 else ""
        return (
            f"key {key_text(key)}: field data differs at byte {diffs[0]} (row {row}, "
            f"column {col}): database {data[diffs[0]]}, source {expected[diffs[0]]}{more}"
        )
    if datum.label != label:
        return f"key {key_text(key)}: field label is {datum.label}, the source has {label}"
    return (
        f"key {key_text(key)}: value of {len(value)} bytes is not Caffe's encoding of "
        f"the source's fields (extra or reordered fields)"
    )


def verify_db(
    db: str | os.PathLike[str],
    images: str | os.PathLike[str] | None = None,
    labels: str | os.PathLike[str] | None = None,
    *,
    isolated: bool = False,
    progress: Progress | None = None,
) -> VerifyResult:
    """Check that database ``db`` holds exactly what ``convert(images, labels)`` writes
    (with the options recorded in the database's ``mnist2db.json``, if any); without
    ``images`` and ``labels``, that its records are the ones mnist2db wrote (their digest).

    The record counts are compared first; then every record is compared with the source,
    key and value, in one pass over the three inputs, a batch at a time. A value equal byte for byte to Caffe's encoding passes;
    otherwise the first differing field is named.

    Raises:
        VerifyError: a record differs (naming its key and field), records are missing, or
            the database holds records the source does not; without sources, the records'
            digest differs from the one recorded, or none is recorded.
        IdxFormatError, BackendError: an input cannot be read.
    """
    progress = reporting(progress)
    if (images is None) != (labels is None):
        raise VerifyError(f"{os.fspath(db)}: give both IMAGES and LABELS, or neither")
    if isolated:
        return _verify_in_a_child(db, images, labels)
    # The records and their options read as one version (the reader's directory).
    with shared_reader(db) as reader:
        if images is None or labels is None:
            return _verify_digest(reader, progress)
        return _verify(reader, images, labels, progress)


#: The child of ``verify_db(isolated=True)``: the count on stdout, or the one line on stderr
#: (an empty stdout says it failed; the child ends as any program does, never by exit()).
_CHILD = """
import sys
from mnist2db.errors import Mnist2dbError
from mnist2db.verify import verify_db
try:
    found = verify_db(*[a or None for a in sys.argv[1:]])
except Mnist2dbError as exc:
    sys.stderr.write(str(exc))
else:
    sys.stdout.write(f"{found.count} {found.rows} {found.cols}")
"""


def _verify_in_a_child(
    db: str | os.PathLike[str],
    images: str | os.PathLike[str] | None,
    labels: str | os.PathLike[str] | None,
) -> VerifyResult:
    """:func:`verify_db` in a child process: liblmdb maps the file, so bytes changed under
    the map by another process can end a reader with SIGBUS, which no check inside it can
    prevent; here that is one error line, and this process goes on."""
    args = [os.fsdecode(a) if a is not None else "" for a in (db, images, labels)]
    child = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, check=False)
    if child.returncode < 0:
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:
            name = f"signal {-child.returncode}"
        raise VerifyError(
            f"{args[0]}: the reader was ended by {name} while reading it (changed or cut "
            "short by another process as it was read?); this process is unharmed"
        )
    if child.returncode or not child.stdout.strip():
        text = os.fsdecode(child.stderr).strip()
        raise VerifyError(" ".join(text.split()) or f"{args[0]}: verify failed")
    count, rows, cols = map(int, child.stdout.split())
    return VerifyResult(count, rows, cols)


def _verify_digest(reader: DbReader, progress: Progress) -> VerifyResult:
    """Every record read again, their digest compared with the one recorded."""
    loaded = load_metadata(reader)
    recorded = None if loaded is None else digest_of(loaded[1])
    if recorded is None:
        why = f"no {METADATA_NAME}" if loaded is None else f"its {METADATA_NAME} records none"
        raise VerifyError(
            f"{reader.path}: no digest of its records to check ({why}: written by Caffe, "
            "another tool or an mnist2db before 0.9?); give its IMAGES and LABELS to "
            "compare it with its source"
        )
    count, sha256 = recorded
    total = len(reader)
    digest = digest_items(reader, lambda count: progress(count, total), _BATCH)
    if digest.count != count:
        raise VerifyError(
            f"{reader.path}: holds {digest.count} records, {METADATA_NAME} records the "
            f"{count} written: records lost or added since"
        )
    if digest.sha256 != sha256:
        raise VerifyError(
            f"{reader.path}: its {count} records are not the ones written: their sha256 is "
            f"{digest.sha256[:16]}…, {METADATA_NAME} records {sha256[:16]}… (a byte changed "
            "since; give IMAGES and LABELS to find the record)"
        )
    return VerifyResult(count, 0, 0)


def _verify(
    reader: DbReader,
    images: str | os.PathLike[str],
    labels: str | os.PathLike[str],
    progress: Progress,
) -> VerifyResult:
    db_path = reader.path
    found = read_metadata(reader)
    recipe = Recipe() if found is None else found[0]
    with open_idx(images) as images_reader, open_idx(labels) as labels_reader:
        check_pair(images_reader.header, labels_reader.header, label_rows=True)
        items = images_reader.header.count
        if found is not None and int(found[1]["source"]["items"]) != items:
            raise VerifyError(
                f"{db_path}: made from a source of {found[1]['source']['items']} items, "
                f"{os.fspath(images)} holds {items}; is it the other split?"
            )
        total = items if recipe.count is None else recipe.count
        rows, cols = images_reader.header.dims[1:]
        if recipe.transpose:
            rows, cols = cols, rows
        order = None if recipe.seed is None else permutation(recipe.seed, total)

        def source_item(index: int) -> int:
            return recipe.offset + (index if order is None else int(order[index]))

        held = len(reader)
        if held != total:
            # Say so first: a database of the other split differs at key 0 already.
            differ = f"{total - held} missing" if held < total else f"{held - total} extra"
            raise VerifyError(
                f"{db_path}: holds {held} records, the source has {total} "
                f"({os.fspath(images)}): {differ}; is it the database of another split?"
            )
        records = iter(reader)
        index = 0
        for image_batch, label_batch in iter_records(images_reader, labels_reader, recipe, _BATCH):
            expected_values = (
                encode_png_batch(
                    image_batch, label_batch, recipe.png_compression or OLD_PNG_COMPRESSION
                )
                if recipe.encoded
                else encode_batch(image_batch, label_batch)
            )
            for j, expected in enumerate(expected_values):
                want_key = record_key(index)
                record = next(records, None)
                if record is None:
                    missing = total - index
                    raise VerifyError(
                        f"{db_path}: {missing} record{'s' if missing > 1 else ''} missing: "
                        f"the database ends after {index} records, the source has {total} "
                        f"(first missing key {want_key.decode()})"
                    )
                key, value = bytes(record[0]), bytes(record[1])
                if key != want_key:
                    if key > want_key:
                        raise VerifyError(
                            f"{db_path}: key {want_key.decode()} missing "
                            f"(the next key is {key_text(key)})"
                        )
                    raise VerifyError(
                        f"{db_path}: key {key_text(key)} is not in the source "
                        f"(expected key {want_key.decode()})"
                    )
                if value != expected and not _same_decoded(
                    value, image_batch[j], int(label_batch[j])
                ):
                    raise VerifyError(
                        f"{db_path}: "
                        + _describe_mismatch(key, value, image_batch[j], int(label_batch[j]))
                        + f" ({os.fspath(images)} item {source_item(index)})"
                    )
                index += 1
            progress(index, total)
        extra_first = next(records, None)
        if extra_first is not None:
            extra = 1
            last = bytes(extra_first[0])
            for last_key, _ in records:
                extra += 1
                last = bytes(last_key)
            first = key_text(bytes(extra_first[0]))
            keys = first if extra == 1 else f"{first} to {key_text(last)}"
            raise VerifyError(
                f"{db_path}: {extra} extra record{'s' if extra > 1 else ''} not in the "
                f"source ({total} items): key{'s' if extra > 1 else ''} {keys}"
            )
    return VerifyResult(total, rows, cols)
