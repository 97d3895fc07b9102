"""Test helpers every suite imports (``from helpers import ...``): tiny IDX files built in
memory or in tmp_path, and Debian's Fashion-MNIST (its files and the digests of what the
real Caffe writes from it)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

import lmdb
import numpy as np
import pytest

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

#: numpy dtype (big-endian, as stored) -> IDX type code
IDX_CODES = {
    np.dtype("u1"): 0x08,
    np.dtype("i1"): 0x09,
    np.dtype(">i2"): 0x0B,
    np.dtype(">i4"): 0x0C,
    np.dtype(">f4"): 0x0D,
    np.dtype(">f8"): 0x0E,
}


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of ``array`` (any of the six IDX dtypes, any rank >= 1)."""
    stored = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    code = IDX_CODES[np.dtype(stored.dtype)]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(stored).tobytes()


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def make_images(count: int, rows: int = 28, cols: int = 28, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, rows, cols), dtype=np.uint8)


def make_labels(count: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10, size=count, dtype=np.uint8)


def fashion_file(name: str) -> Path:
    """A Debian Fashion-MNIST file (``.gz`` as Debian ships it), or skip the test."""
    for candidate in (FASHION_DIR / name, FASHION_DIR / f"{name}.gz"):
        if candidate.exists():
            return candidate
    pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({FASHION_DIR})")


#: Records written by the real Caffe convert_mnist_data from Debian's Fashion-MNIST: count and
#: the :func:`record_digest` of its output (the same for its LMDB and LevelDB outputs).
FASHION_DIGESTS = {
    "train": (60000, "cf8f41069ab0b4f729a2a1637b04f586e936e1319fd6033af8fc71cedd01668c"),
    "t10k": (10000, "2dc00bc680cecf9443cc7c4214066f4211d4b3989991745da969dc0a442c3e21"),
}


def record_digest(path: Path) -> tuple[int, str]:
    """Count and sha256 over, in key order, 4-byte big-endian len(key), key, len(value), value."""
    from mnist2db.storage.readers import open_reader

    digest = hashlib.sha256()
    count = 0
    with open_reader(path) as reader:
        for key, value in reader:
            key, value = bytes(key), bytes(value)
            digest.update(struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value)
            count += 1
    return count, digest.hexdigest()


def serialize(data: bytes, rows: int, cols: int, label: int) -> bytes:
    """protobuf's own bytes for a one-channel Datum (what the fast encoders must equal)."""
    from mnist2db.datum_pb2 import Datum

    datum = Datum()
    datum.channels, datum.height, datum.width = 1, rows, cols
    datum.data = data
    datum.label = label
    return datum.SerializeToString()


def converted(mnist_pair, tmp_path: Path, backend: str = "lmdb", count: int = 25, **kw):
    from mnist2db import convert

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


def write_lmdb(path: Path, records: dict[bytes, bytes]) -> Path:
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for key, value in records.items():
            txn.put(key, value)
    env.close()
    return path


def write_raw_db(path: Path, backend: str, records: dict[bytes, bytes]) -> Path:
    """A database of exactly ``records``, written with the backend's own library (not mnist2db)."""
    if backend == "lmdb":
        return write_lmdb(path, records)
    import plyvel

    db = plyvel.DB(str(path), create_if_missing=True)
    for key, value in records.items():
        db.put(key, value)
    db.close()
    return path


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real small file system at ``mount`` (created), unmounted afterwards: a real full disk.
    Skips the test where mounting is not allowed (not root, or no mount namespace)."""
    import subprocess

    mount.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)
