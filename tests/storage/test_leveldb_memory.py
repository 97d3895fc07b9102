"""LevelDB conversion in bounded memory: the memtable is sized from the data, never
Caffe's 256 MiB (two of which were resident at once: 519 MiB at 1,000,000 records)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import write_idx

from mnist2db.storage.databases.backends import size_hint
from mnist2db.storage.databases.readers import open_reader
from mnist2db.storage.databases.writers import (
    LEVELDB_MEMTABLE_MAX,
    LEVELDB_MEMTABLE_STREAMING,
    leveldb_write_buffer,
)


def test_the_memtable_holds_a_database_that_fits_and_is_small_otherwise() -> None:
    # Fashion-MNIST's training set: 60,000 values of 796 bytes, held whole (no table written).
    whole = leveldb_write_buffer(size_hint(60_000, 796))
    assert 60_000 * (796 + 8) * 1.25 < whole <= LEVELDB_MEMTABLE_MAX
    for hint in (size_hint(1_000_000, 796), size_hint(10**8, 796), 0):
        assert leveldb_write_buffer(hint) == LEVELDB_MEMTABLE_STREAMING
    assert leveldb_write_buffer(size_hint(10, 796)) < 2 << 20


CHILD = """
import sys, mnist2db
mnist2db.convert(sys.argv[1], sys.argv[2], sys.argv[3], backend="leveldb")
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


def test_a_leveldb_conversion_larger_than_any_memtable_stays_under_150_mib(
    tmp_path: Path,
) -> None:
    """250,000 records (200 MB of values): Caffe's 256 MiB memtable would hold them all."""
    count = 250_000
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    images_path = write_idx(tmp_path / "big-images-idx3-ubyte", images)
    labels_path = write_idx(
        tmp_path / "big-labels-idx1-ubyte", (np.arange(count) % 10).astype(np.uint8)
    )
    del images
    db = tmp_path / "db"
    # VmHWM: the peak resident memory of the child's own address space (not the parent's).
    peak_kib = int(
        subprocess.run(
            [sys.executable, "-c", CHILD, str(images_path), str(labels_path), str(db)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert peak_kib < 150 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    # The records are Caffe's: spot-check against the LMDB the same conversion writes.
    import mnist2db

    mnist2db.convert(images_path, labels_path, tmp_path / "lmdb")
    with open_reader(str(db)) as leveldb_reader, open_reader(str(tmp_path / "lmdb")) as lmdb_reader:
        seen = 0
        for (key_a, value_a), (key_b, value_b) in zip(leveldb_reader, lmdb_reader, strict=True):
            assert bytes(key_a) == bytes(key_b) and bytes(value_a) == bytes(value_b)
            seen += 1
    assert seen == count
