"""A batch is held in memory until it is committed: a batch size whose records would take
more than BATCH_BYTES_LIMIT is refused before any work, in one line naming the option and
the figures (storage/backends.py: check_batch_bytes)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx

from mnist2db import ArgumentError, convert
from mnist2db.cli.app import cli
from mnist2db.siamese import convert_siamese
from mnist2db.storage.backends import BATCH_BYTES_LIMIT, check_batch_bytes


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def sparse_mnist(tmp_path: Path, count: int, rows: int, cols: int) -> tuple[Path, Path]:
    """An IDX pair of ``count`` images of ``rows`` x ``cols`` (all black: a sparse file, so
    a large one costs no disk)."""
    images = tmp_path / "images"
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, rows, cols))
        f.truncate(16 + count * rows * cols)
    labels = write_idx(tmp_path / "labels", np.zeros(count, np.uint8))
    return images, labels


# MNIST's records: a Datum of 796 bytes (784 pixels, its fields and the label) under an
# 8-byte key: 804 bytes; 83,468 of them fit 64 MiB (67,108,864 bytes), 83,469 do not.
MNIST_REFUSAL = (
    "--batch-size 100000000: a batch of 100000 records × 804 bytes = 80400000 bytes "
    "(76.7 MiB) held in memory, more than the 64 MiB a batch may hold; use --batch-size "
    "83468 or less (Caffe commits every 1000; the records are the same at any batch size)"
)


def test_the_limit_is_64_mib_and_exact() -> None:
    assert BATCH_BYTES_LIMIT == 64 << 20
    check_batch_bytes(83468, 100000, 796)  # 67,108,272 bytes
    with pytest.raises(ArgumentError) as caught:
        check_batch_bytes(83469, 100000, 796)  # 67,109,076 bytes
    assert str(caught.value).startswith(
        "--batch-size 83469: a batch of 83469 records × 804 bytes = 67109076 bytes (64.0 MiB)"
    )
    with pytest.raises(ArgumentError) as caught:
        check_batch_bytes(100000000, 100000, 796)
    assert str(caught.value) == MNIST_REFUSAL


def test_a_batch_is_bounded_by_the_records_there_are() -> None:
    check_batch_bytes(100000000, 80000, 796)  # 80,000 records: 61.3 MiB in one batch
    check_batch_bytes(10**9, 1, 2**31)  # one record a batch always fits, whatever its size
    check_batch_bytes(1, 10**6, 2**31)


def test_convert_refuses_a_batch_that_cannot_fit_before_any_work(tmp_path: Path) -> None:
    images, labels = sparse_mnist(tmp_path, 100000, 28, 28)
    before = sorted(os.listdir(tmp_path))
    result = run("convert", "--batch-size", 100000000, images, labels, tmp_path / "db")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"Error: {MNIST_REFUSAL}\n")
    assert sorted(os.listdir(tmp_path)) == before  # no database, no staging directory

    with pytest.raises(ArgumentError) as caught:  # the options' pipeline too
        convert(images, labels, tmp_path / "db", batch_size=100000000, shuffle=True, seed=1)
    assert str(caught.value) == (  # a Datum with room for any label: 8 bytes more
        "--batch-size 100000000: a batch of 100000 records × 812 bytes = 81200000 bytes "
        "(77.4 MiB) held in memory, more than the 64 MiB a batch may hold; use --batch-size "
        "82646 or less (Caffe commits every 1000; the records are the same at any batch size)"
    )
    assert sorted(os.listdir(tmp_path)) == before


def test_large_records_bound_the_default_batch(tmp_path: Path) -> None:
    """Caffe's 1000 records a transaction is refused where 1000 records take more than
    64 MiB: 30 images of 1500 x 1500 (2.25 MB each)."""
    images, labels = sparse_mnist(tmp_path, 30, 1500, 1500)
    result = run("convert", images, labels, tmp_path / "db")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: --batch-size 1000: a batch of 30 records × 2250024 bytes = 67500720 bytes "
        "(64.4 MiB) held in memory, more than the 64 MiB a batch may hold; use --batch-size "
        "29 or less (Caffe commits every 1000; the records are the same at any batch size)\n"
    )
    assert not (tmp_path / "db").exists()
    result = run("convert", "--batch-size", 29, images, labels, tmp_path / "db")
    assert result.exit_code == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "db")) == ["data.mdb", "lock.mdb"]


def test_siamese_pairs_are_bounded_too(tmp_path: Path) -> None:
    images, labels = sparse_mnist(tmp_path, 50000, 28, 28)
    with pytest.raises(ArgumentError) as caught:
        convert_siamese(images, labels, tmp_path / "db", batch_size=50000, seed=1)
    assert str(caught.value).startswith(
        "--batch-size 50000: a batch of 50000 records × 1587 bytes = 79350000 bytes (75.7 MiB)"
    )
    assert not (tmp_path / "db").exists()


def test_the_drop_in_names_its_flag(tmp_path: Path) -> None:
    images, labels = sparse_mnist(tmp_path, 100000, 28, 28)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from mnist2db.caffe_tools.drop_ins import run; sys.exit(run(sys.argv[1:]))",
            "--batch_size=100000000",
            str(images),
            str(labels),
            str(tmp_path / "db"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1  # refused before Caffe's lines
    assert (
        done.stderr.split("] ", 1)[1]
        == MNIST_REFUSAL.replace("--batch-size", "--batch_size") + "\n"
    )
    assert not (tmp_path / "db").exists()
