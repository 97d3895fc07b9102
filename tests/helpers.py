"""Test helpers every suite imports (``from helpers import ...``): tiny IDX files built in
memory or in tmp_path, and Debian's Fashion-MNIST files. Databases are db_helpers.py's;
mounts and processes os_helpers.py's."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

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
