"""A batch is held in memory until it is committed: it stops at ``batch_size`` records or at
BATCH_BYTES_LIMIT bytes of records, whichever comes first (storage/databases/backends.py:
batch_records), so no batch size makes a conversion hold the dataset, and no record size
makes Caffe's default batch refuse one."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import write_idx

from mnist2db import convert, open_db
from mnist2db.conversion import raw_value_size
from mnist2db.siamese import convert_siamese
from mnist2db.storage.databases.backends import BATCH_BYTES_LIMIT, batch_records


def sparse_mnist(tmp_path: Path, count: int, rows: int, cols: int) -> tuple[Path, Path]:
    """An IDX pair of ``count`` images of ``rows`` x ``cols`` (all black: a sparse file, so
    a large one costs no disk)."""
    images = tmp_path / "images"
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, rows, cols))
        f.truncate(16 + count * rows * cols)
    labels = write_idx(tmp_path / "labels", (np.arange(count) % 10).astype(np.uint8))
    return images, labels


def test_a_batch_stops_at_64_mib_of_records() -> None:
    assert BATCH_BYTES_LIMIT == 64 << 20
    # A plain conversion's MNIST records, counted at 796 bytes (room for any label byte)
    # under an 8-byte key: 83,468 of them fit 64 MiB (67,108,272 bytes), 83,469 do not.
    assert raw_value_size(28, 28) == 796
    assert batch_records(1000, 796) == 1000
    assert batch_records(83468, 796) == 83468
    assert batch_records(83469, 796) == 83468
    assert batch_records(100000000, 796) == 83468
    # A 1500 x 1500 image: 2,250,016 bytes and its key: 29 a batch.
    assert batch_records(1000, 2250016) == 29
    assert batch_records(7, 2250016) == 7
    # One record a batch, whatever its size.
    assert batch_records(1000, 2**31) == 1
    assert batch_records(1, 10) == 1


def test_a_huge_batch_size_converts_in_bounded_memory(tmp_path: Path) -> None:
    """300,000 MNIST-sized records in one batch would be 241 MB of records and about 1.2 GB
    of peak memory (5x, measured); a batch of 64 MiB keeps the process near 430 MiB."""
    images, labels = sparse_mnist(tmp_path, 300000, 28, 28)
    out = tmp_path / "db"
    code = (
        "import resource, sys, mnist2db; "
        "mnist2db.convert(sys.argv[1], sys.argv[2], sys.argv[3], batch_size=100000000); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(images), str(labels), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    peak_mib = int(done.stdout) / 1024
    assert peak_mib < 700, f"peak RSS {peak_mib:.0f} MiB"
    print(f"peak RSS {peak_mib:.0f} MiB")
    with open_db(out) as db:
        assert len(db) == 300000
        image, label = db[299999]
        assert image.shape == (1, 28, 28) and not image.any() and label == 299999 % 10


def test_large_records_convert_with_caffes_default_batch(tmp_path: Path) -> None:
    """30 images of 1500 x 1500: Caffe's 1000 a transaction would hold 67.5 MB; the
    transactions hold 29 and 1, and the database is whole."""
    images, labels = sparse_mnist(tmp_path, 30, 1500, 1500)
    result = convert(images, labels, tmp_path / "db")
    assert result.count == 30
    with open_db(tmp_path / "db") as db:
        assert len(db) == 30
        image, label = db[29]
        assert image.shape == (1, 1500, 1500) and not image.any() and label == 9


def test_siamese_pairs_of_large_images_are_bounded_too(tmp_path: Path) -> None:
    images, labels = sparse_mnist(tmp_path, 20, 1300, 1300)  # pairs of 3.4 MB: 19 a batch
    result = convert_siamese(images, labels, tmp_path / "db", seed=1)
    with open_db(tmp_path / "db") as db:
        assert len(db) == result.count == 20
        assert db[19][0].shape == (2, 1300, 1300)


def test_the_drop_in_takes_a_huge_batch_size(tmp_path: Path) -> None:
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
    assert done.returncode == 0, done.stderr
    assert "A total of 100000 items." in done.stderr
    with open_db(tmp_path / "db") as db:
        assert len(db) == 100000
