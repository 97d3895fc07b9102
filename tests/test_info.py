"""mnist2db info: exact reports on IDX files and databases (info.py)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import converted, rewrite_lmdb, write_lmdb
from helpers import idx_bytes, write_idx

from mnist2db.cli.app import cli


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


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


def test_info_without_metadata_claims_no_orientation(mnist_pair, tmp_path: Path) -> None:
    # Caffe's databases hold no mnist2db.json, and those mnist2db writes without options
    # hold only their records' digest: how their images were oriented, ordered or cut is
    # not recorded, so info must not claim "as the source stores it".
    db, *_ = converted(mnist_pair, tmp_path)
    result = run("info", db)
    assert result.exit_code == 0, result.output
    assert "orientation" not in result.stdout
    assert "options     not recorded (mnist2db.json holds the records' digest alone)\n" in (
        result.stdout
    )
    (db / "mnist2db.json").unlink()
    result = run("info", db)
    assert "options     not recorded (no mnist2db.json)\n" in result.stdout


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


def test_info_verify_export_while_a_dataset_holds_the_database(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    """Neither backend lets one process open a database twice: the commands share the
    dataset's handle instead of failing with 'already open' / 'lock already held'."""
    from mnist2db import open_db
    from mnist2db.exporting.to_idx import export_db
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


def test_info_database_with_data_shorter_than_its_shape(tmp_path: Path) -> None:
    from mnist2db.formats.datum.message import encode_datum

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
