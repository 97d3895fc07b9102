"""The fast paths of issue 5 give exactly what the plain ones give: bytes, keys, output, memory."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import make_images, make_labels, record_digest, write_idx
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.__main__ import parse_convert
from mnist2db.conversion import convert
from mnist2db.datum import encode_batch, encode_raw_batch, record_keys
from mnist2db.datum_pb2 import Datum
from mnist2db.errors import IdxFormatError
from mnist2db.idxreader import open_idx
from mnist2db.readers import open_reader


def serialize(data: bytes, rows: int, cols: int, label: int) -> bytes:
    datum = Datum()
    datum.channels, datum.height, datum.width = 1, rows, cols
    datum.data = data
    datum.label = label
    return datum.SerializeToString()


# -- the encoder --------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 12),
    rows=st.integers(0, 40),
    cols=st.integers(0, 40),
    labels=st.lists(st.integers(0, 255), min_size=12, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_raw_batch_equals_serialize_to_string(
    n: int, rows: int, cols: int, labels: list[int], seed: int
) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, size=n * rows * cols, dtype=np.uint8)
    raw_labels = bytes(labels[:n])
    values = encode_raw_batch(memoryview(pixels.tobytes()), raw_labels, rows, cols)
    size = rows * cols
    expected = [
        serialize(pixels[i * size : (i + 1) * size].tobytes(), rows, cols, raw_labels[i])
        for i in range(n)
    ]
    assert values == expected
    assert all(type(v) is bytes for v in values)


@pytest.mark.parametrize("labels", [bytes(range(128)), bytes(range(256)), b"\x7f\x80\xff\x00"])
def test_encode_raw_batch_both_label_paths(labels: bytes) -> None:
    """Labels below 0x80 take the one-buffer path; 0x80 and above are two-byte varints."""
    pixels = make_images(len(labels), 3, 5).tobytes()
    values = encode_raw_batch(pixels, labels, 3, 5)
    assert values == [
        serialize(pixels[i * 15 : (i + 1) * 15], 3, 5, label) for i, label in enumerate(labels)
    ]
    numpy_values = encode_batch(
        np.frombuffer(pixels, np.uint8).reshape(-1, 3, 5), np.frombuffer(labels, np.uint8)
    )
    assert values == numpy_values


def test_encode_raw_batch_rejects_a_size_mismatch() -> None:
    with pytest.raises(ValueError, match="10 pixel bytes for 2 images of 2 × 3"):
        encode_raw_batch(b"\0" * 10, b"\1\2", 2, 3)


# -- the keys -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    start=st.one_of(st.integers(0, 5000), st.integers(10**8 - 3000, 10**8 + 10)),
    count=st.integers(0, 2500),
)
def test_record_keys_equal_caffe_format(start: int, count: int) -> None:
    assert list(record_keys(start, count)) == [b"%08d" % i for i in range(start, start + count)]


# -- raw batches --------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_iter_raw_batches_yields_the_file_in_order(tmp_path: Path, gz: bool) -> None:
    images = make_images(7, 4, 3)
    path = write_idx(tmp_path / "img", images, gz=gz)
    with open_idx(path) as reader:
        chunks = [bytes(view) for view in reader.iter_raw_batches(3)]
    assert [len(c) for c in chunks] == [36, 36, 12]
    assert b"".join(chunks) == images.tobytes()


def read_error(path: Path, raw: bool) -> str:
    with pytest.raises(IdxFormatError) as info, open_idx(path) as reader:
        for _ in reader.iter_raw_batches(2) if raw else reader.iter_batches(2):
            pass
    return str(info.value)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("extra", [b"xy", b""])
def test_iter_raw_batches_errors_like_iter_batches(tmp_path: Path, gz: bool, extra: bytes) -> None:
    labels = make_labels(5)
    data = bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + labels.tobytes()
    data = data[:-2] if not extra else data + extra
    path = tmp_path / "lab"
    path.write_bytes(gzip.compress(data) if gz else data)
    message = read_error(path, raw=True)
    assert message == read_error(path, raw=False)
    fault = "trailing bytes" if extra else "truncated"
    assert message.startswith(f"{path}: {fault}: header declares 5 bytes of data (5 uint8)")


# -- whole conversions --------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 7, 1000, 5000])
def test_batch_sizes_give_the_same_records(mnist_pair, tmp_path: Path, batch_size: int) -> None:
    ipath, lpath, images, labels = mnist_pair(2003, 5, 4)
    convert(ipath, lpath, tmp_path / "db", batch_size=batch_size)
    with open_reader(tmp_path / "db") as reader:
        records = [(bytes(k), bytes(v)) for k, v in reader]
    assert records == [
        (b"%08d" % i, serialize(images[i].tobytes(), 5, 4, int(labels[i]))) for i in range(2003)
    ]


# -- the click-free launcher --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["convert", "a", "b", "c"], {"images": "a", "labels": "b", "out": "c"}),
        (
            [
                "convert",
                "-q",
                "--backend=LevelDB",
                "a",
                "--batch-size",
                "7",
                "b",
                "c",
                "--overwrite",
            ],
            {
                "quiet": True,
                "backend": "leveldb",
                "batch_size": 7,
                "overwrite": True,
                "images": "a",
                "labels": "b",
                "out": "c",
            },
        ),
    ],
)
def test_parse_convert_accepts_plain_command_lines(
    args: list[str], expected: dict[str, object]
) -> None:
    assert parse_convert(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["convert", "--help"],
        ["convert", "a", "b"],
        ["convert", "a", "b", "c", "d"],
        ["convert", "--backend=sqlite", "a", "b", "c"],
        ["convert", "--batch-size=0", "a", "b", "c"],
        ["convert", "--batch-size=1_000", "a", "b", "c"],
        ["convert", "--batch-size", "a", "b", "c"],
        ["convert", "-q", "-q", "a", "b", "c"],
        ["convert", "--quiet=yes", "a", "b", "c"],
        ["convert", "--", "a", "b", "c"],
        ["convert", "-", "b", "c"],
        ["convert", "", "b", "c"],
        ["fetch", "a", "b", "c"],
    ],
)
def test_parse_convert_leaves_everything_else_to_click(args: list[str]) -> None:
    assert parse_convert(args) is None


LAUNCH = (
    "import sys\n"
    "from mnist2db.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('click' in sys.modules)\n"
)


def run_both(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], ...]:
    """Run ``args`` through the launcher (fast path) and through click (mnist2db.cli.main)."""
    fast = subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, cwd=cwd
    )
    slow = subprocess.run(
        [sys.executable, "-c", "from mnist2db.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    return fast, slow


def test_launcher_converts_without_click_like_click(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(30)
    fast = subprocess.run(
        [sys.executable, "-c", LAUNCH, "convert", str(ipath), str(lpath), "fast_db"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    slow = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mnist2db.cli import main; main()",
            "convert",
            str(ipath),
            str(lpath),
            "slow_db",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (fast.returncode, fast.stdout) == (0, "False\n")  # click was never imported
    assert slow.returncode == 0
    strip_time = [line.rsplit(" in ", 1)[0] for line in fast.stderr.splitlines()]
    assert strip_time == [
        line.rsplit(" in ", 1)[0].replace("slow_db", "fast_db") for line in slow.stderr.splitlines()
    ]
    assert strip_time[0] == "A total of 30 items."
    assert record_digest(tmp_path / "fast_db") == record_digest(tmp_path / "slow_db")


@pytest.mark.parametrize(
    ("args", "code", "first_line"),
    [
        (["convert", "-q", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (["convert", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (
            ["convert", "--batch-size", "0", "a", "b", "db"],
            2,
            "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB",
        ),
        (["convert", "a", "b"], 2, "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB"),
    ],
)
def test_launcher_errors_match_click(
    tmp_path: Path, args: list[str], code: int, first_line: str
) -> None:
    fast, slow = run_both(args, tmp_path)
    assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    assert fast.returncode == code
    assert fast.stderr.splitlines()[0] == first_line


def test_launcher_refuses_an_existing_output_like_click(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(3)
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "notes.txt").write_text("mine")
    fast, slow = run_both(["convert", "-q", str(ipath), str(lpath), "db"], tmp_path)
    assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    assert fast.returncode == 1
    assert fast.stderr == "Error: db: already exists (use --overwrite to replace it)\n"
    assert (tmp_path / "db" / "notes.txt").read_text() == "mine"


# -- memory -------------------------------------------------------------------------------


#: Spawns argv[1:] and prints its peak RSS. Linux counts the spawning process's memory in
#: the child's ru_maxrss (exec records the old address space's high-water mark), so the
#: child is spawned from this bare interpreter rather than from pytest.
REAPER = (
    "import os, sys\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def peak_rss_kib(argv: list[str]) -> int:
    result = subprocess.run(
        [sys.executable, "-c", REAPER, *argv], capture_output=True, text=True, check=True
    )
    code, peak = result.stdout.split()[-2:]
    assert code == "0", result
    return int(peak)


def test_memory_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    """Ten times the records (31 MB more pixels) adds only a few MB of peak RSS.

    A converter holding the dataset (or all its values) would add at least the 31 MB.
    """
    peaks = {}
    for count in (4000, 40000):
        rng = np.random.default_rng(count)
        images = write_idx(
            tmp_path / f"img{count}", rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        )
        labels = write_idx(tmp_path / f"lab{count}", rng.integers(0, 10, count, dtype=np.uint8))
        peaks[count] = peak_rss_kib(
            [
                sys.executable,
                "-c",
                LAUNCH,
                "convert",
                "-q",
                str(images),
                str(labels),
                str(tmp_path / f"db{count}"),
            ]
        )
    assert peaks[40000] - peaks[4000] < 12 * 1024, peaks
