"""Caffe's keys stop at 10**8 records: every writer refuses more up front,
with one owner of the limit (formats.datum.check_record_count). ``siamese --pairs
100000000000`` ran until the disk was full."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx

from mnist2db import convert
from mnist2db.errors import Mnist2dbError
from mnist2db.formats.datum.message import KEY_LIMIT, check_record_count
from mnist2db.siamese import convert_siamese

MNIST2DB = [sys.executable, "-m", "mnist2db"]
SIAMESE_TOOL = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import siamese_main; siamese_main()",
]


def _limit_message(where: object, count: int, unit: str) -> str:
    return (
        f"{where}: {count} {unit}, more than the 100000000 records a database can hold "
        '(Caffe\'s "%08d" keys stop sorting in record order after 99999999)'
    )


def test_the_limit_is_caffes_key_space() -> None:
    check_record_count(KEY_LIMIT, "x")  # 00000000 … 99999999: all of them fit
    with pytest.raises(Mnist2dbError) as info:
        check_record_count(KEY_LIMIT + 1, "x", "pairs")
    assert str(info.value) == _limit_message("x", KEY_LIMIT + 1, "pairs")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_idx(tmp_path / "i", make_images(10, 3, 3)),
        write_idx(tmp_path / "l", make_labels(10)),
    )


@pytest.mark.parametrize("pairs", [KEY_LIMIT + 1, 100_000_000_000])
def test_siamese_refuses_more_pairs_than_keys_before_any_work(
    pair: tuple[Path, Path], tmp_path: Path, pairs: int
) -> None:
    out = tmp_path / "out" / "pairs"
    started = time.monotonic()
    done = subprocess.run(
        [*MNIST2DB, "siamese", *pair, out, "--pairs", str(pairs), "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30  # refused, not written until the disk is full
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: {_limit_message(out, pairs, 'pairs')}\n"
    assert sorted(os.listdir(tmp_path)) == ["i", "l"]  # not even out/


def test_the_siamese_drop_in_refuses_it_too(pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "pairs"
    done = subprocess.run(
        [*SIAMESE_TOOL, *map(str, pair), str(out), "--pairs=100000000000", "--logtostderr"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.rstrip().split("] ", 1)[1] == _limit_message(out, 10**11, "pairs")
    assert not out.exists()


def test_the_library_refuses_it(pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(Mnist2dbError, match="more than the 100000000 records"):
        convert_siamese(*pair, tmp_path / "p", pairs=KEY_LIMIT + 1)
    assert not (tmp_path / "p").exists()


def _fifo_writer(path: Path, data: bytes) -> threading.Thread:
    os.mkfifo(path)

    def feed() -> None:
        try:
            with open(path, "wb") as pipe:
                pipe.write(data)
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def test_convert_refuses_a_source_promising_more_items_than_keys(tmp_path: Path) -> None:
    """A pipe's header promises 100000001 images: refused on the header, before a record is
    read or a database started (on a regular file the size check comes first)."""
    count = KEY_LIMIT + 1
    images, labels = tmp_path / "images", tmp_path / "labels"
    writers = [
        _fifo_writer(images, struct.pack(">IIII", 0x803, count, 1, 1)),
        _fifo_writer(labels, struct.pack(">II", 0x801, count)),
    ]
    out = tmp_path / "db"
    with pytest.raises(Mnist2dbError) as info:
        convert(images, labels, out)
    assert str(info.value) == _limit_message(images, count, "items")
    for writer in writers:
        writer.join(10)
    assert sorted(os.listdir(tmp_path)) == ["images", "labels"]
