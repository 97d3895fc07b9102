"""Caffe's mean file on real data: Debian's Fashion-MNIST training set, both backends.

The reference is the file the real Caffe ``compute_image_mean`` wrote from Caffe's own
``convert_mnist_data`` output: 3147 bytes, sha256 below; Caffe logged
``mean_value channel [0]: 72.9403``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fashion_file

from mnist2db import convert
from mnist2db.mean import blobproto_bytes, compute_mean

CAFFE_MEAN_SHA256 = "d290079549b978c9d4887d0755acd62fe1f56e031dd401ce2833c4b181ce604a"
CAFFE_MEAN_HEAD = bytes.fromhex("08 01 10 01 18 1c 20 1c 2a c0 18")


@pytest.fixture(scope="module", params=["lmdb", "leveldb"])
def fashion_train(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    images = fashion_file("train-images-idx3-ubyte")
    labels = fashion_file("train-labels-idx1-ubyte")
    out = tmp_path_factory.mktemp("fashion") / f"train_{request.param}"
    convert(images, labels, out, backend=request.param)
    return out


def test_mean_file_matches_caffe(fashion_train: Path) -> None:
    data = blobproto_bytes(compute_mean(fashion_train).mean)
    assert len(data) == 3147
    assert data[: len(CAFFE_MEAN_HEAD)] == CAFFE_MEAN_HEAD
    assert hashlib.sha256(data).hexdigest() == CAFFE_MEAN_SHA256


def test_compute_image_mean_drop_in_matches_caffe(fashion_train: Path, tmp_path: Path) -> None:
    out = tmp_path / "mean.binaryproto"
    backend = fashion_train.name.split("_")[1]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mnist2db.caffe_tools.drop_ins import mean_main; mean_main()",
            f"--backend={backend}",
            str(fashion_train),
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() == CAFFE_MEAN_SHA256
    logged = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    assert logged[-2:] == ["Number of channels: 1", "mean_value channel [0]: 72.9403"]
    assert logged[2:8] == [f"Processed {n} files." for n in range(10000, 60001, 10000)]
