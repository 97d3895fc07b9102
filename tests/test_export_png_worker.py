"""exporting.png_worker: raw records' PNGs encoded in a forked process, the same bytes as
here; its errors and its end (with the export, however the export ends)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import fashion_file
from hypothesis import given
from hypothesis import strategies as st

from mnist2db import Mnist2dbError, convert
from mnist2db.exporting.png_worker import PngWorker, worth_a_worker
from mnist2db.exporting.sample_batches import iter_batches, start_png_worker
from mnist2db.storage.databases.readers import shared_reader

needs_two_cpus = pytest.mark.skipif(not worth_a_worker(), reason="one CPU: no worker is started")


def _raw_db(tmp_path: Path, count: int) -> Path:
    db = tmp_path / "raw"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db,
            count=count)  # fmt: skip
    return db


@needs_two_cpus
def test_the_worker_encodes_the_pngs_encoded_here(tmp_path: Path) -> None:
    db = _raw_db(tmp_path, 6000)
    with shared_reader(db) as reader:
        worker = start_png_worker(reader.get(reader.first_key() or b""))
        assert worker is not None
        try:
            remote = [
                bytes(d) for b in iter_batches(str(db), reader.iter_views(), worker) for d in b.data
            ]
        finally:
            worker.close()
        local = [bytes(d) for b in iter_batches(str(db), reader.iter_views()) for d in b.data]
    assert worker.answered > 0  # some batches went to the worker, the others were made here
    assert remote == local and len(local) == 6000
    assert start_png_worker(b"not a raw record") is None


def test_an_error_in_the_worker_is_raised_here() -> None:
    def fails(images: np.ndarray) -> list[bytes]:
        raise ValueError(f"no PNG for {images.shape}")

    worker = PngWorker(fails)
    try:
        with pytest.raises(Mnist2dbError, match=r"process failed: no PNG for \(2, 3, 4\)"):
            worker.encode_remote(np.zeros((2, 3, 4), np.uint8))
        with pytest.raises(Mnist2dbError, match="process failed"):  # and it serves on
            worker.encode_remote(np.zeros((1, 1, 1), np.uint8))
    finally:
        worker.close()


def test_a_worker_that_dies_is_an_error_not_a_hang() -> None:
    worker = PngWorker(lambda images: os._exit(3))
    try:
        with pytest.raises(Mnist2dbError, match=rf"process \(pid {worker.pid}\) ended"):
            worker.encode_remote(np.zeros((2, 3, 4), np.uint8))
    finally:
        worker.close()


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found |= {int(c) for c in f.read().split()}
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@needs_two_cpus
@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc")
def test_a_killed_export_leaves_no_worker_behind(tmp_path: Path) -> None:
    db = _raw_db(tmp_path, 10000)
    out = tmp_path / "s"
    args = ["export", "--to", "webdataset", "--shard-size", "200", "--quiet", str(db), str(out)]
    export = subprocess.Popen([sys.executable, "-m", "mnist2db", *args])
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{out}-000001.tar").exists() and export.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        workers = _children(export.pid)
        export.kill()
    finally:
        export.wait()
    assert export.returncode == -9, "finished before it could be killed"
    assert len(workers) == 1
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in workers):  # the worker reads the end of its pipe
        assert time.monotonic() < deadline, "the PNG worker outlived its export"
        time.sleep(0.01)


@pytest.mark.parametrize("shape", [(5, 28, 28), (3, 1, 1), (2, 300, 7), (0, 4, 4)])
def test_grey_pngs_are_the_pngs_convert_stores(shape: tuple[int, int, int]) -> None:
    """encode_grey_pngs (what the export writes) gives each record's data of encode_png_batch
    (what convert --encoded png stores), byte for byte."""
    from mnist2db.formats.datum.message import decode_datum
    from mnist2db.formats.png.encoder import encode_grey_pngs, encode_png_batch

    images = np.random.default_rng(7).integers(0, 256, shape, dtype=np.uint8)
    if shape[0]:
        images[0] = 0
    records = encode_png_batch(images, np.arange(shape[0]) * 300)
    assert encode_grey_pngs(images) == [decode_datum(record).data for record in records]


@given(
    st.integers(1, 4), st.integers(1, 200), st.integers(1, 40), st.integers(0, 300),
    st.integers(-1, 40), st.integers(0, 255),
)  # fmt: skip
def test_the_fixed_layout_is_raw_layouts(
    channels: int, height: int, width: int, label: int, flip: int, byte: int
) -> None:
    """FixedLayout.of (without protobuf) finds the layout raw_layout finds (through
    protobuf), for records in it and records one byte off it."""
    from mnist2db.exporting.fixed_layout import FixedLayout
    from mnist2db.formats.datum.message import encode_datum, raw_layout

    value = bytearray(encode_datum(bytes(channels * height * width), channels, height, width,
                                   label))  # fmt: skip
    if 0 <= flip < len(value):
        value[flip] = byte
    found = FixedLayout.of(bytes(value))
    expected = raw_layout(bytes(value))
    got = None if found is None else (found.length, found.prefix, found.shape, found.offset)
    assert got == expected
