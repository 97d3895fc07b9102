"""mnist2db export: IDX files back from a database, byte for byte, placed together (exporting/to_idx.py)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import converted, rewrite_lmdb, write_lmdb
from helpers import write_idx

from mnist2db import array_to_datum, convert
from mnist2db.cli.app import cli
from mnist2db.exporting.to_idx import default_prefix


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


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
    # Caffe's names only, not substrings ("latest" holds "test").
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


@pytest.mark.parametrize("prefix", ["../escaped", "sub/name", ""])
def test_export_prefix_is_a_name_not_a_path(prefix: str, mnist_pair, tmp_path: Path) -> None:
    """The files go into OUT_DIR and nowhere else: a prefix with '/' (or none) is refused
    before anything is written."""
    images, labels, _, _ = mnist_pair(3)
    convert(images, labels, tmp_path / "db")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("export", tmp_path / "db", tmp_path / "out", "--prefix", prefix)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: --prefix {prefix!r}: a file name prefix, without '/' (OUT_DIR is the folder)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out/, nothing escaped


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
    """convert writes an empty database; export gives it back (0 items)."""
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
    expected = {
        db: f"{db}: is the input {db}; refusing to write into it (write it somewhere else)",
        db / "sub": f"{db / 'sub'}: is inside the input {db}; refusing to write there "
        "(write it somewhere else)",
    }
    for out, message in expected.items():
        result = run("export", db, out, "--prefix", "x")
        assert result.exit_code == 1
        assert result.stderr == f"Error: {message}\n"
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
