"""read_idx / open_idx: formats, gzip by content, and every size fault found before allocating."""

from __future__ import annotations

import contextlib
import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import idx_bytes, make_images, make_labels, write_idx
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mnist2db import IdxFormatError, read_header, read_idx
from mnist2db.formats.idx.reader import open_idx

DTYPES = ["u1", "i1", ">i2", ">i4", ">f4", ">f8"]


@settings(max_examples=60, deadline=None)
@given(
    array=st.sampled_from(DTYPES).flatmap(
        lambda dt: hnp.arrays(
            np.dtype(dt),
            hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5),
            elements={"allow_nan": False} if dt.startswith(">f") else None,
        )
    ),
    gz=st.booleans(),
)
def test_round_trip_every_type(
    tmp_path_factory: pytest.TempPathFactory, array: np.ndarray, gz: bool
) -> None:
    path = tmp_path_factory.mktemp("idx") / "data-idx"
    write_idx(path, array, gz=gz)
    back = read_idx(path)
    assert back.shape == array.shape
    assert back.dtype == array.dtype.newbyteorder("=")
    np.testing.assert_array_equal(back, array)


def test_header_fields(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "t-images-idx3-ubyte", np.zeros((3, 4, 5), np.uint8))
    header = read_header(path)
    assert (header.magic, header.dims, header.type_name) == (2051, (3, 4, 5), "uint8")
    assert (header.header_size, header.item_size, header.payload_size) == (16, 20, 60)
    assert header.gzipped is False


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    gz_without_suffix = write_idx(tmp_path / "labels-idx2-ubyte", array, gz=True)
    plain_with_suffix = write_idx(tmp_path / "labels-idx2-ubyte.gz", array, gz=False)
    assert read_header(gz_without_suffix).gzipped is True
    assert read_header(plain_with_suffix).gzipped is False
    np.testing.assert_array_equal(read_idx(gz_without_suffix), array)
    np.testing.assert_array_equal(read_idx(plain_with_suffix), array)


def test_dotted_file_name(tmp_path: Path) -> None:
    array = np.arange(8, dtype=np.uint8).reshape(2, 2, 2)
    path = write_idx(tmp_path / "train-images.idx3-ubyte", array)
    np.testing.assert_array_equal(read_idx(path), array)


def test_multi_member_gzip(tmp_path: Path) -> None:
    data = idx_bytes(np.arange(100, dtype=np.uint8).reshape(10, 10))
    path = tmp_path / "multi"
    path.write_bytes(gzip.compress(data[:37]) + gzip.compress(data[37:]))
    np.testing.assert_array_equal(read_idx(path), np.arange(100, dtype=np.uint8).reshape(10, 10))


def test_iter_batches_streams_in_order(tmp_path: Path) -> None:
    array = np.arange(7 * 6, dtype=np.uint8).reshape(7, 2, 3)
    for gz in (False, True):
        path = write_idx(tmp_path / f"b{gz}", array, gz=gz)
        with open_idx(path) as reader:
            batches = list(reader.iter_batches(3))
        assert [len(b) for b in batches] == [3, 3, 1]
        np.testing.assert_array_equal(np.concatenate(batches), array)


def _raw(tmp_path: Path, data: bytes, name: str = "f-idx3-ubyte") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _error(path: Path) -> str:
    with pytest.raises(IdxFormatError) as info:
        read_idx(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_truncated_payload(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((4, 3, 3), np.uint8))
    path = _raw(tmp_path, data[:-5])
    assert _error(path) == (
        f"{path}: truncated: header declares 36 bytes of data (4 × 3 × 3 uint8), file holds 31"
    )


def test_trailing_bytes(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((4, 3, 3), np.uint8))
    path = _raw(tmp_path, data + b"xx")
    assert _error(path) == (
        f"{path}: trailing bytes: header declares 36 bytes of data (4 × 3 × 3 uint8), file holds 38"
    )


@pytest.mark.parametrize("extra", [-5, 2])
def test_gzip_size_faults(tmp_path: Path, extra: int) -> None:
    data = idx_bytes(np.zeros((4, 3, 3), np.uint8))
    data = data[:extra] if extra < 0 else data + b"\0" * extra
    path = _raw(tmp_path, gzip.compress(data))
    fault = "truncated" if extra < 0 else "trailing bytes"
    assert _error(path) == (
        f"{path}: {fault}: header declares 36 bytes of data (4 × 3 × 3 uint8), file holds {36 + extra}"
    )


def test_absurd_dimensions_refused_before_allocation(tmp_path: Path) -> None:
    # 4 294 967 295 × 4 294 967 295 × 4 294 967 295 bytes: no machine could allocate it.
    header = bytes([0, 0, 8, 3]) + struct.pack(">3I", 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    path = _raw(tmp_path, header + b"\0" * 100)
    message = _error(path)
    assert message.startswith(
        f"{path}: truncated: header declares 79228162458924105385300197375 bytes"
    )
    assert message.endswith("file holds 100")


def test_absurd_dimensions_in_gzip(tmp_path: Path) -> None:
    header = bytes([0, 0, 8, 3]) + struct.pack(">3I", 0xFFFFFFFF, 1 << 20, 1 << 20)
    path = _raw(tmp_path, gzip.compress(header + b"\0" * 1000))
    # Refused from the file's size alone (deflate expands at most 1032-fold), unread.
    size = path.stat().st_size
    assert _error(path).endswith(
        f"a gzip file of {size} bytes holds at most {1032 * size + (1 << 20)}"
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "truncated header: the magic number needs 4 bytes, file has 0"),
        (b"\0\0\x08", "truncated header: the magic number needs 4 bytes, file has 3"),
        (
            b"\0\0\x08\x03\0\0\0\x01",
            "truncated header: 3 dimension sizes needs 12 bytes, file has 4",
        ),
        (
            b"PK\x03\x04rest",
            "not an IDX file: magic 0x504b0304, expected 0x0000 then type and rank",
        ),
        (b"\0\0\x07\x01\0\0\0\0", "magic 0x00000701 has unknown type code 0x07"),
        (b"\0\0\x08\x00", "magic 0x00000800 declares 0 dimensions"),
    ],
)
def test_header_faults(tmp_path: Path, data: bytes, expected: str) -> None:
    path = _raw(tmp_path, data)
    assert _error(path).startswith(f"{path}: {expected}")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert _error(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such file"
    (tmp_path / "dir").mkdir()
    assert _error(tmp_path / "dir") == f"{tmp_path / 'dir'}: is a directory, expected an IDX file"


def test_corrupt_gzip(tmp_path: Path) -> None:
    blob = bytearray(gzip.compress(idx_bytes(np.arange(4000, dtype=np.uint8).reshape(40, 100))))
    blob[30:40] = b"\xff" * 10
    path = _raw(tmp_path, bytes(blob))
    assert _error(path).startswith(f"{path}: corrupt gzip stream: ")


def test_gzip_cut_short(tmp_path: Path) -> None:
    blob = gzip.compress(idx_bytes(np.arange(4000, dtype=np.uint8).reshape(40, 100)))
    path = _raw(tmp_path, blob[: len(blob) // 2])
    message = _error(path)
    assert message.startswith(f"{path}: ")
    assert "corrupt gzip stream" in message or "truncated" in message


# -- pipes, FIFOs, /dev/stdin, process substitution ----------------------------------------


def fifo_feeding(tmp_path: Path, data: bytes, name: str = "fifo") -> Path:
    """A real FIFO that a thread fills with ``data`` once a reader opens it."""
    import os
    import threading

    fifo = tmp_path / name
    os.mkfifo(fifo)

    def feed() -> None:
        # The reader may stop early (a size error): that is the point.
        with open(fifo, "wb") as f, contextlib.suppress(BrokenPipeError):
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return fifo


@pytest.mark.parametrize("gz", [False, True])
def test_fifo_is_read_as_a_stream(tmp_path: Path, gz: bool) -> None:
    array = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    data = idx_bytes(array)
    fifo = fifo_feeding(tmp_path, gzip.compress(data) if gz else data)
    with open_idx(fifo) as reader:
        assert reader.streaming
        assert reader.header.dims == (3, 4, 5) and reader.header.gzipped == gz
        batches = list(reader.iter_batches(2))
    assert [b.shape for b in batches] == [(2, 4, 5), (1, 4, 5)]
    np.testing.assert_array_equal(np.concatenate(batches), array)
    assert read_idx(fifo_feeding(tmp_path, data, "again")).tolist() == array.tolist()


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(("change", "fault"), [(-3, "truncated"), (5, "trailing bytes")])
def test_fifo_sizes_are_checked_as_data_arrives(
    tmp_path: Path, gz: bool, change: int, fault: str
) -> None:
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    data = idx_bytes(array)
    data = data[:change] if change < 0 else data + bytes(change)
    fifo = fifo_feeding(tmp_path, gzip.compress(data) if gz else data)
    holds = 18 + change
    with pytest.raises(IdxFormatError) as info, open_idx(fifo) as reader:
        list(reader.iter_raw_batches(1))
    assert str(info.value) == (
        f"{fifo}: {fault}: header declares 18 bytes of data (2 × 3 × 3 uint8), file holds {holds}"
    )


def test_fifo_header_promising_terabytes_holds_only_what_arrives(tmp_path: Path) -> None:
    import tracemalloc

    head = bytes([0, 0, 8, 3]) + struct.pack(">3I", 1 << 20, 1 << 10, 1 << 10)
    fifo = fifo_feeding(tmp_path, head + bytes(5000))
    tracemalloc.start()
    try:
        with (
            pytest.raises(IdxFormatError, match="truncated: .* file holds 5000$"),
            open_idx(fifo) as reader,
        ):
            next(reader.iter_raw_batches(1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


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
