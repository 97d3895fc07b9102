"""mnist2db info, verify and export: exact reports, named mismatches, byte-for-byte round trips."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import click
import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import idx_bytes, write_idx

from mnist2db import array_to_datum, convert
from mnist2db.cli import cli
from mnist2db.export import default_prefix


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(params=["lmdb", "leveldb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def converted(mnist_pair, tmp_path: Path, backend: str = "lmdb", count: int = 25, **kw):
    images, labels, image_array, label_array = mnist_pair(count, 6, 5, **kw)
    db = tmp_path / f"tiny_{backend}"
    convert(images, labels, db, backend=backend)
    return db, images, labels, image_array, label_array


def rewrite_lmdb(db: Path, edit) -> None:
    """Apply ``edit(txn)`` to an LMDB database with lmdb itself (no mnist2db code)."""
    env = lmdb.open(str(db), map_size=1 << 24)
    with env.begin(write=True) as txn:
        edit(txn)
    env.close()


def flip(key: bytes, offset: int):
    def edit(txn) -> None:
        value = bytearray(txn.get(key))
        value[offset] ^= 0x5A
        txn.put(key, bytes(value))

    return edit


# -- info ----------------------------------------------------------------------------------


def test_info_plain_image_file(mnist_pair) -> None:
    images, _, _, _ = mnist_pair(25, 6, 5)
    result = run("info", images)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"file        {images}\n"
        "storage     plain, 766 bytes\n"
        "magic       0x00000803 (MNIST images)\n"
        "type        uint8\n"
        "dimensions  25 × 6 × 5\n"
        "items       25\n"
        "size        766 bytes expected, 766 found (header 16 + data)\n"
        "valid       yes\n"
    )


def test_info_gzip_label_file_has_histogram(tmp_path: Path) -> None:
    labels = np.array([3, 3, 1, 9, 3, 0, 1], dtype=np.uint8)
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels, gz=True)
    result = run("info", path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == f"storage     gzip, {path.stat().st_size} bytes compressed"
    assert lines[2:] == [
        "magic       0x00000801 (MNIST labels)",
        "type        uint8",
        "dimensions  7",
        "items       7",
        "size        15 bytes expected, 15 found (header 8 + data)",
        "labels      0: 1  1: 2  3: 3  9: 1",
        "valid       yes",
    ]


def test_info_truncated_gzip_is_invalid(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((3, 4, 5), dtype=np.uint8))[:-10]
    path = tmp_path / "cut-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(data))
    result = run("info", path)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-2:] == [
        "size        76 bytes expected, 66 found (header 16 + data)",
        "valid       no",
    ]
    assert result.stderr == (
        f"Error: {path}: truncated: header declares 60 bytes of data (3 × 4 × 5 uint8), "
        "file holds 50\n"
    )


def test_info_trailing_bytes_and_other_types(tmp_path: Path) -> None:
    path = tmp_path / "floats"
    path.write_bytes(idx_bytes(np.zeros((2, 3), dtype=">f4")) + b"xyz")
    result = run("info", path)
    assert result.exit_code == 1
    assert "magic       0x00000d02 (IDX array)\ntype        float32\n" in result.stdout
    assert result.stderr == (
        f"Error: {path}: trailing bytes: header declares 24 bytes of data (2 × 3 float32), "
        "file holds 27\n"
    )


def test_info_not_an_idx_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello world")
    result = run("info", path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {path}: not an IDX file: magic 0x68656c6c, expected 0x0000 then type and rank\n"
    )


def test_info_database(mnist_pair, tmp_path: Path, backend: str) -> None:
    db, _, _, _, labels = converted(mnist_pair, tmp_path, backend)
    counts = np.bincount(labels, minlength=10)
    entries = [f"{v}: {n}" for v, n in enumerate(counts) if n]
    result = run("info", db)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        f"database    {db}",
        f"backend     {backend}",
        "records     25",
        "keys        00000000 … 00000024 (Caffe's %08d sequence)",
        "datum       1 × 6 × 5 (channels × height × width), uint8 data",
    ]
    assert lines[5] == "labels      " + "  ".join(entries[:5])
    size = sum(p.stat().st_size for p in db.iterdir())
    assert lines[-2:] == [f"size        {size} bytes on disk", "valid       yes"]


def test_info_database_with_a_broken_record(mnist_pair, tmp_path: Path) -> None:
    db, *_ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, lambda txn: txn.put(b"00000004", b"\xff\xff\xff"))
    result = run("info", db)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "valid       no"
    assert result.stderr.startswith(f"Error: {db}: key 00000004: value of 3 bytes is not a Datum")


HOLDER = """
import sys, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 24, readonly=sys.argv[2] == "reader")
txn = env.begin(write=sys.argv[2] == "writer")
if sys.argv[2] == "writer":
    txn.put(b"99999999", b"uncommitted")
else:
    txn.get(b"00000000")
print("holding", flush=True)
sys.stdin.readline()
txn.abort()
"""


@pytest.mark.parametrize("role", ["reader", "writer"])
def test_info_while_another_process_uses_the_lmdb(mnist_pair, tmp_path: Path, role: str) -> None:
    db, *_ = converted(mnist_pair, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        result = run("info", db)
        assert result.exit_code == 0, result.output
        assert "records     25\n" in result.stdout
        assert "keys        00000000 … 00000024 (Caffe's %08d sequence)\n" in result.stdout
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0


# -- verify --------------------------------------------------------------------------------


def test_verify_passes_on_a_fresh_conversion(mnist_pair, tmp_path: Path, backend: str) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path, backend, gz=True)
    result = run("verify", db, images, labels)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"OK: {db} holds the 25 records of {images} and {labels}.\n"


def test_verify_names_a_changed_data_byte(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, image_array, _ = converted(mnist_pair, tmp_path)
    # 6 × 5 images: the Datum is 08 01 10 06 18 05 22 1e, 30 pixels, 28 <label>.
    rewrite_lmdb(db, flip(b"00000003", 8 + 7))
    source = int(image_array[3, 1, 2])
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {db}: key 00000003: field data differs at byte 7 (row 1, column 2): "
        f"database {source ^ 0x5A}, source {source} ({images} item 3)\n"
    )


@pytest.mark.parametrize(
    ("offset", "field"),
    [(3, "height"), (5, "width"), (1, "channels")],
)
def test_verify_names_a_changed_shape_field(
    mnist_pair, tmp_path: Path, offset: int, field: str
) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, flip(b"00000011", offset))
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    want = {"height": 6, "width": 5, "channels": 1}[field]
    assert result.stderr == (
        f"Error: {db}: key 00000011: field {field} is {want ^ 0x5A}, the source has {want} "
        f"({images} item 11)\n"
    )


def test_verify_names_a_changed_label(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, label_array = converted(mnist_pair, tmp_path)

    def relabel(txn) -> None:
        value = bytearray(txn.get(b"00000020"))
        value[-1] = (label_array[20] + 1) % 10
        txn.put(b"00000020", bytes(value))

    rewrite_lmdb(db, relabel)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: key 00000020: field label is {(label_array[20] + 1) % 10}, "
        f"the source has {label_array[20]} ({images} item 20)\n"
    )


def test_verify_reports_a_value_that_is_not_a_datum(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, lambda txn: txn.put(b"00000000", b"\x08"))
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {db}: key 00000000: value of 1 bytes is not a Datum: ")


def test_verify_reports_missing_records(mnist_pair, tmp_path: Path, backend: str) -> None:
    images, labels, image_array, label_array = mnist_pair(25, 6, 5)
    short_images = write_idx(tmp_path / "short-images", image_array[:20])
    short_labels = write_idx(tmp_path / "short-labels", label_array[:20])
    db = tmp_path / "short_db"
    convert(short_images, short_labels, db, backend=backend)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 20 records, the source has 25 ({images}): 5 missing; "
        "is it the database of another split?\n"
    )
    # The other way round: the database holds records the source does not.
    result = run(
        "verify",
        db,
        write_idx(tmp_path / "i18", image_array[:18]),
        write_idx(tmp_path / "l18", label_array[:18]),
    )
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 20 records, the source has 18 ({tmp_path / 'i18'}): 2 extra; "
        "is it the database of another split?\n"
    )


def test_verify_against_the_other_split_says_so(mnist_pair, tmp_path: Path) -> None:
    """Item 10: a test database checked against the training files differed 'at key 0'."""
    train_images, train_labels, *_ = mnist_pair(30, stem="train", seed=1)
    test_images, test_labels, *_ = mnist_pair(10, stem="t10k", seed=2)
    db = tmp_path / "mnist_test_lmdb"
    convert(test_images, test_labels, db)
    result = run("verify", db, train_images, train_labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 10 records, the source has 30 ({train_images}): 20 missing; "
        "is it the database of another split?\n"
    )


def test_verify_reports_a_deleted_key(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)

    def replace_key(txn: object) -> None:
        value = txn.get(b"00000005")  # type: ignore[attr-defined]
        txn.delete(b"00000005")  # type: ignore[attr-defined]
        txn.put(b"00000005x", value)  # type: ignore[attr-defined]

    rewrite_lmdb(db, replace_key)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {db}: key 00000005 missing (the next key is 00000005x)\n"


def test_verify_input_errors(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    result = run("verify", db, labels, images)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {labels}: magic 0x00000801, expected 0x00000803")
    (tmp_path / "empty").mkdir()
    result = run("verify", tmp_path / "empty", images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'empty'}: neither an LMDB (no data.mdb) nor a LevelDB "
        "(no CURRENT) database\n"
    )


# -- export --------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_export_round_trips_byte_for_byte(
    mnist_pair, tmp_path: Path, backend: str, gz: bool
) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path, backend, gz=gz)
    out = tmp_path / "out" / "nested"
    result = run("export", db, out, "--prefix", "train")
    assert result.exit_code == 0, result.output
    exported_images = out / "train-images-idx3-ubyte"
    exported_labels = out / "train-labels-idx1-ubyte"
    assert result.stderr == (f"Wrote {exported_images} and {exported_labels} (25 items, 6 × 5).\n")
    original_images, original_labels = images.read_bytes(), labels.read_bytes()
    if gz:
        original_images = gzip.decompress(original_images)
        original_labels = gzip.decompress(original_labels)
    assert exported_images.read_bytes() == original_images
    assert exported_labels.read_bytes() == original_labels
    assert sorted(p.name for p in out.iterdir()) == [exported_images.name, exported_labels.name]


def test_export_default_prefix(mnist_pair, tmp_path: Path) -> None:
    assert default_prefix("examples/mnist/mnist_train_lmdb") == "train"
    assert default_prefix("examples/mnist/mnist_test_leveldb/") == "t10k"
    assert default_prefix("digits") == "digits"
    # Item 13: Caffe's names only, not substrings ("latest" holds "test").
    assert default_prefix("latest_train_lmdb") == "train"
    assert default_prefix("latest_lmdb") == "latest_lmdb"
    assert default_prefix("contest_results") == "contest_results"
    assert default_prefix("fashion_test_leveldb") == "t10k"
    assert default_prefix("t10k_lmdb") == "t10k_lmdb"
    images, labels, _, _ = mnist_pair(4, 6, 5)
    convert(images, labels, tmp_path / "mnist_test_lmdb")
    result = run("export", tmp_path / "mnist_test_lmdb", tmp_path / "out", "-q")
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert (tmp_path / "out" / "t10k-images-idx3-ubyte").read_bytes() == images.read_bytes()
    assert (tmp_path / "out" / "t10k-labels-idx1-ubyte").read_bytes() == labels.read_bytes()


def test_export_never_replaces_files_unasked(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "x-labels-idx1-ubyte").write_bytes(b"keep me")
    result = run("export", db, out, "--prefix", "x")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out / 'x-labels-idx1-ubyte'}: already exists (use --overwrite to replace it)\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["x-labels-idx1-ubyte"]
    assert (out / "x-labels-idx1-ubyte").read_bytes() == b"keep me"
    result = run("export", db, out, "--prefix", "x", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "x-labels-idx1-ubyte").read_bytes() == labels.read_bytes()


def write_lmdb(path: Path, records: dict[bytes, bytes]) -> Path:
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for key, value in records.items():
            txn.put(key, value)
    env.close()
    return path


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (
            array_to_datum(np.zeros((1, 2, 2), np.float32), 1).SerializeToString(),
            "not raw uint8 pixels (float_data, 0 data bytes)",
        ),
        (
            array_to_datum(np.zeros((3, 2, 2), np.uint8), 1).SerializeToString(),
            "Datum 3×2×2, an IDX image file needs every record 1×2×2",
        ),
        (
            array_to_datum(np.zeros((1, 2, 2), np.uint8), 300).SerializeToString(),
            "label 300 does not fit a uint8 IDX label file",
        ),
    ],
)
def test_export_refuses_what_idx_cannot_hold(tmp_path: Path, second: bytes, message: str) -> None:
    first = array_to_datum(np.ones((1, 2, 2), np.uint8), 7).SerializeToString()
    db = write_lmdb(tmp_path / "odd_lmdb", {b"00000000": first, b"00000001": second})
    result = run("export", db, tmp_path / "out", "--prefix", "odd")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {db}: key 00000001: {message}\n"
    assert not (tmp_path / "out").exists()  # made by the export, removed with it


def test_export_empty_database_round_trips(tmp_path: Path) -> None:
    """Item 13: convert writes an empty database; export gives it back (0 items)."""
    images = write_idx(tmp_path / "i", np.zeros((0, 28, 28), np.uint8))
    labels = write_idx(tmp_path / "l", np.zeros((0,), np.uint8))
    db = tmp_path / "empty_lmdb"
    convert(images, labels, db)
    result = run("export", db, tmp_path / "out", "--prefix", "e")
    assert result.exit_code == 0, result.output
    assert result.stderr.endswith("(0 items, 28 × 28).\n")
    assert (tmp_path / "out" / "e-images-idx3-ubyte").read_bytes() == images.read_bytes()
    assert (tmp_path / "out" / "e-labels-idx1-ubyte").read_bytes() == labels.read_bytes()


def test_export_header_matches_caffe_layout(tmp_path: Path) -> None:
    datum = array_to_datum(np.arange(6, dtype=np.uint8).reshape(1, 2, 3), 4).SerializeToString()
    db = write_lmdb(tmp_path / "one_lmdb", {b"00000000": datum})
    result = run("export", db, tmp_path, "--prefix", "one", "-q")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "one-images-idx3-ubyte").read_bytes() == struct.pack(
        ">4I", 0x803, 1, 2, 3
    ) + bytes(range(6))
    assert (tmp_path / "one-labels-idx1-ubyte").read_bytes() == struct.pack(
        ">2I", 0x801, 1
    ) + b"\x04"


def test_info_verify_export_while_a_dataset_holds_the_database(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    """Neither backend lets one process open a database twice: the commands share the
    dataset's handle instead of failing with 'already open' / 'lock already held'."""
    from mnist2db import open_db
    from mnist2db.export import export_db
    from mnist2db.info import db_info
    from mnist2db.verify import verify_db

    db, images, labels, _, label_array = converted(mnist_pair, tmp_path, backend)
    with open_db(db) as dataset:
        assert dataset[3][1] == int(label_array[3])
        assert db_info(db).count == 25
        assert verify_db(db, images, labels).count == 25
        result = export_db(db, tmp_path / "out", prefix="x")
        assert result.count == 25
        assert dataset[4][1] == int(label_array[4])  # the shared handle is still open
    assert (tmp_path / "out" / "x-images-idx3-ubyte").read_bytes() == images.read_bytes()


@pytest.mark.parametrize("key", [b"00000000", b"00000003"])
def test_export_names_the_record_that_is_not_a_datum(
    mnist_pair, tmp_path: Path, key: bytes
) -> None:
    db, *_ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, lambda txn: txn.put(key, b"\xff\xff"))
    result = run("export", db, tmp_path / "out")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {db}: key {key.decode()}: value of 2 bytes is not a Datum: "
    )
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()  # no file, no temporary, no directory


def test_info_database_with_data_shorter_than_its_shape(tmp_path: Path) -> None:
    from mnist2db.datum import encode_datum

    db = write_lmdb(
        tmp_path / "short_lmdb",
        {
            b"00000000": encode_datum(b"\0" * 4, 1, 2, 2, 1),
            b"00000001": encode_datum(b"\0" * 3, 1, 2, 2, 1),
        },
    )
    result = run("info", db)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "valid       no"
    assert result.stderr == (
        f"Error: {db}: key 00000001: Datum holds 3 data bytes, shape (1, 2, 2) needs 4\n"
    )


# -- issue 10, item 3: export's pair is checked first and placed together -----------------


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_export_checks_both_targets_before_any_work(mnist_pair, tmp_path: Path, kind: str) -> None:
    """`export db o2 --overwrite` with the labels target a directory replaced the images."""
    import os

    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    out = tmp_path / "o2"
    out.mkdir()
    (out / "x-images-idx3-ubyte").write_bytes(b"old images")
    target = out / "x-labels-idx1-ubyte"
    if kind == "directory":
        target.mkdir()
        what = "is a directory"
    else:
        os.mkfifo(target)
        what = "is not a regular file"
    result = run("export", db, out, "--prefix", "x", "--overwrite")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {target}: {what}; refusing to replace it (even with --overwrite)\n"
    )
    assert (out / "x-images-idx3-ubyte").read_bytes() == b"old images"
    assert sorted(p.name for p in out.iterdir()) == ["x-images-idx3-ubyte", "x-labels-idx1-ubyte"]


def test_export_into_the_database_is_refused(mnist_pair, tmp_path: Path) -> None:
    db, *_ = converted(mnist_pair, tmp_path)
    before = sorted(p.name for p in db.iterdir())
    for out in (db, db / "sub"):
        result = run("export", db, out, "--prefix", "x")
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: {out}: is inside the database {db}; write the files elsewhere\n"
        )
    assert sorted(p.name for p in db.iterdir()) == before


def test_export_replaces_both_with_overwrite(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "x-images-idx3-ubyte").write_bytes(b"old images")
    (out / "x-labels-idx1-ubyte").write_bytes(b"old labels")
    result = run("export", db, out, "--prefix", "x", "--overwrite", "-q")
    assert result.exit_code == 0, result.output
    assert (out / "x-images-idx3-ubyte").read_bytes() == images.read_bytes()
    assert (out / "x-labels-idx1-ubyte").read_bytes() == labels.read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["x-images-idx3-ubyte", "x-labels-idx1-ubyte"]
