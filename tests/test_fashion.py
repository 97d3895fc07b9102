"""Byte identity with Caffe on real data: Debian's Fashion-MNIST through every front end.

The reference digests were computed from the real Caffe ``convert_mnist_data`` output as
sha256 over, for each record in key order, 4-byte big-endian len(key), key, 4-byte
big-endian len(value), value. They hold for Caffe's LMDB and LevelDB outputs alike.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from db_helpers import record_digest
from helpers import FASHION_DIGESTS, fashion_file

from mnist2db import convert
from mnist2db.cli.app import cli

REFERENCE = FASHION_DIGESTS


def inputs(split: str) -> tuple[Path, Path]:
    return fashion_file(f"{split}-images-idx3-ubyte"), fashion_file(f"{split}-labels-idx1-ubyte")


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize("split", ["train", "t10k"])
def test_library_matches_caffe(tmp_path: Path, split: str, backend: str) -> None:
    images, labels = inputs(split)
    out = tmp_path / f"{split}_{backend}"
    convert(images, labels, out, backend=backend)
    assert record_digest(out) == REFERENCE[split]


def test_mnist2db_convert_matches_caffe(tmp_path: Path) -> None:
    images, labels = inputs("t10k")
    out = tmp_path / "mnist_test_lmdb"
    result = CliRunner().invoke(
        cli, ["convert", "-q", "--backend=lmdb", str(images), str(labels), str(out)]
    )
    assert result.exit_code == 0, result.output
    assert record_digest(out) == REFERENCE["t10k"]


def test_convert_mnist_data_matches_caffe(tmp_path: Path) -> None:
    images, labels = inputs("t10k")
    out = tmp_path / "mnist_test_leveldb"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mnist2db.caffe_tools.drop_ins import main; main()",
            str(images),
            str(labels),
            str(out),
            "--backend=leveldb",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert record_digest(out) == REFERENCE["t10k"]


def test_plain_files_match_too(tmp_path: Path) -> None:
    import gzip
    import shutil

    plain = []
    for path in inputs("t10k"):
        target = tmp_path / path.name.removesuffix(".gz")
        with gzip.open(path, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        plain.append(target)
    convert(plain[0], plain[1], tmp_path / "db")
    assert record_digest(tmp_path / "db") == REFERENCE["t10k"]
