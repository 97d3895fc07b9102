"""Fuzzed input: for every pair of files, ``convert`` writes exactly the right records or
raises ``Mnist2dbError`` — never another exception, never a hang, never a large allocation.

The inputs start as a valid MNIST pair and are mutated: the magic (prefix, type code,
rank), the dimension sizes (small, zero, and huge values), the payload (cut short or
extended), and the container (plain, gzip, gzip cut short, gzip with a flipped byte or
trailing bytes). The expected outcome comes from an independent oracle written here from
the IDX format's definition, not from the library.
"""

from __future__ import annotations

import gzip
import os
import signal
import struct
import tempfile
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from mnist2db.cli.app import cli
from mnist2db.conversion import STAGING_MARK, convert
from mnist2db.errors import Mnist2dbError
from mnist2db.storage.databases.readers import iter_db

INT32_MAX = (1 << 31) - 1
WATCHDOG_SECONDS = 30  # a hang guard, far above any example's run time; not a speed test
MEMORY_LIMIT = 16 << 20  # traced peak per conversion; the inputs are at most a few KiB

DIM_VALUES = st.one_of(
    st.integers(0, 6),
    st.sampled_from([784, 1 << 16, INT32_MAX, 1 << 31, (1 << 32) - 1]),
)

Expected = tuple[int, int, list[tuple[bytes, int]]]


class Hang(Exception):
    pass


@contextmanager
def watchdog() -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {WATCHDOG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, WATCHDOG_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@st.composite
def idx_file(
    draw: st.DrawFn, type_code: int, dims: list[int], payload: bytes, mutate: bool = True
) -> bytes:
    """An IDX file built from ``dims`` and ``payload``, then possibly mutated."""
    prefix, code, ndim = b"\0\0", type_code, len(dims)
    if not mutate:
        data = bytes([0, 0, code, ndim]) + struct.pack(f">{ndim}I", *dims) + payload
        return gzip.compress(data, mtime=0) if draw(st.booleans()) else data
    if draw(st.integers(0, 4)) == 0:  # mutate the magic
        prefix = draw(st.sampled_from([b"\0\0", b"\0\x01", b"\x1f\x8b", b"\xff\xff"]))
        code = draw(st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0x07, 0xFF]))
        ndim = draw(st.integers(0, 5))
    dims = list(dims)
    if draw(st.integers(0, 3)) == 0:  # mutate the dimension sizes, or how many are written
        for i in draw(st.lists(st.integers(0, len(dims) - 1), max_size=3)):
            dims[i] = draw(DIM_VALUES)
        if draw(st.integers(0, 3)) == 0:
            dims = dims[:-1] if draw(st.booleans()) else [*dims, draw(DIM_VALUES)]
    mode = draw(st.sampled_from(["keep"] * 3 + ["cut", "extend"]))
    if mode == "cut":
        payload = payload[: draw(st.integers(0, max(0, len(payload) - 1)))]
    elif mode == "extend":
        payload += draw(st.binary(min_size=1, max_size=40))
    data = prefix + bytes([code, ndim]) + b"".join(struct.pack(">I", d) for d in dims) + payload
    if draw(st.integers(0, 6)) == 0:  # cut anywhere, header included
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        data = gzip.compress(data, mtime=0)
        damage = draw(st.sampled_from(["none"] * 4 + ["cut", "flip", "trail", "zeros", "twice"]))
        if damage == "cut":
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif damage == "flip":
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
        elif damage == "trail":
            data += draw(st.binary(min_size=1, max_size=20))
        elif damage == "zeros":
            data += bytes(draw(st.integers(1, 20)))
        elif damage == "twice":  # a multi-member gzip file: the content twice
            data += data
    return data


@st.composite
def mnist_pairs(draw: st.DrawFn) -> tuple[bytes, bytes]:
    count = draw(st.integers(0, 4))
    rows = draw(st.integers(0, 5))
    cols = draw(st.integers(0, 5))
    pixels = draw(st.binary(min_size=count * rows * cols, max_size=count * rows * cols))
    labels = draw(st.binary(min_size=count, max_size=count))
    mutated = draw(st.sampled_from(["none", "images", "labels", "both", "both"]))
    return (
        draw(idx_file(0x08, [count, rows, cols], pixels, mutated in ("images", "both"))),
        draw(idx_file(0x08, [count], labels, mutated in ("labels", "both"))),
    )


def _content(raw: bytes) -> bytes | None:
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error):
            return None
    return raw


def oracle(images_raw: bytes, labels_raw: bytes) -> Expected | None:
    """(rows, cols, [(pixels, label), ...]) for a valid MNIST pair, else None."""
    images, labels = _content(images_raw), _content(labels_raw)
    if images is None or labels is None:
        return None
    if len(images) < 16 or images[:4] != b"\0\0\x08\x03":
        return None
    n, rows, cols = struct.unpack(">3I", images[4:16])
    size = rows * cols
    if labels[:4] == b"\0\0\x0c\x02" and len(labels) >= 12:
        # QMNIST's idx2-int label rows (a mutated magic can make one): column 0 is the label
        m, columns = struct.unpack(">2I", labels[4:12])
        if columns < 1 or len(labels) != 12 + 4 * m * columns:
            return None
        values = [
            struct.unpack(">i", labels[12 + 4 * i * columns : 16 + 4 * i * columns])[0]
            for i in range(m)
        ]
    elif len(labels) >= 8 and labels[:4] == b"\0\0\x08\x01":
        (m,) = struct.unpack(">I", labels[4:8])
        if len(labels) != 8 + m:
            return None
        values = list(labels[8:])
    else:
        return None
    if len(images) != 16 + n * size or n != m:
        return None
    if rows > INT32_MAX or cols > INT32_MAX or size > INT32_MAX:  # Datum's fields are int32
        return None
    records = [(images[16 + i * size : 16 + (i + 1) * size], values[i]) for i in range(n)]
    return rows, cols, records


def write_pair(directory: Path, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    images, labels = directory / "images", directory / "labels"
    images.write_bytes(pair[0])
    labels.write_bytes(pair[1])
    return images, labels


def assert_records(out: Path, expected: Expected) -> None:
    rows, cols, records = expected
    got = list(iter_db(out))
    assert len(got) == len(records)
    for i, ((key, datum), (pixels, label)) in enumerate(zip(got, records, strict=True)):
        assert key == b"%08d" % i
        assert (datum.channels, datum.height, datum.width) == (1, rows, cols)
        assert (datum.data, datum.label) == (pixels, label)


FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(pair=mnist_pairs())
# found by this test: an empty image file and an empty QMNIST idx2-int label file of one
# column convert to an empty database (the oracle took only idx1 labels)
@example(pair=(b"\0\0\x08\x03" + bytes(12), b"\0\0\x0c\x02" + bytes(7) + b"\x01"))
@example(
    pair=(
        b"\0\0\x08\x03" + struct.pack(">3I", 2, 1, 1) + b"ab",
        b"\0\0\x0c\x02" + struct.pack(">2I", 2, 2) + struct.pack(">4i", -3, 9, 7, 1),
    )
)
def test_convert_writes_the_right_records_or_raises_its_own_error(
    tmp_path: Path, pair: tuple[bytes, bytes]
) -> None:
    expected = oracle(*pair)
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        images, labels = write_pair(Path(work), pair)
        out = Path(work) / "db"
        tracemalloc.start()
        try:
            with watchdog():
                try:
                    convert(images, labels, out, batch_size=3)
                except Mnist2dbError as exc:
                    error: Mnist2dbError | None = exc
                else:
                    error = None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < MEMORY_LIMIT
        event("converted" if error is None else (str(error).split(": ") + ["?"])[1].split(" ")[0])
        if expected is None:
            assert error is not None, "an invalid pair was converted"
            assert "\n" not in str(error)
            assert not os.path.lexists(out)
        else:
            assert error is None, f"a valid pair was refused: {error}"
            assert_records(out, expected)
        assert [p for p in os.listdir(work) if STAGING_MARK in p] == []


@settings(FUZZ, max_examples=60)
@given(pair=mnist_pairs())
def test_cli_exits_0_or_1_with_one_line(tmp_path: Path, pair: tuple[bytes, bytes]) -> None:
    expected = oracle(*pair)
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        images, labels = write_pair(Path(work), pair)
        out = Path(work) / "db"
        with watchdog():
            result = CliRunner().invoke(cli, ["convert", "-q", str(images), str(labels), str(out)])
        if expected is None:
            assert result.exit_code == 1, result.output
            assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
            assert "Traceback" not in result.output
        else:
            assert (result.exit_code, result.stderr) == (0, "")
            assert_records(out, expected)


def test_oracle_accepts_a_valid_pair() -> None:
    """The oracle itself: a plain and a gzip-wrapped valid pair are accepted."""
    images = b"\0\0\x08\x03" + struct.pack(">3I", 2, 1, 2) + b"\x01\x02\x03\x04"
    labels = b"\0\0\x08\x01" + struct.pack(">I", 2) + b"\x05\x06"
    expected = (1, 2, [(b"\x01\x02", 5), (b"\x03\x04", 6)])
    assert oracle(images, labels) == expected
    assert oracle(gzip.compress(images), labels) == expected
    assert oracle(images + b"\0", labels) is None
    with pytest.raises(AssertionError):
        assert oracle(images[:-1], labels) is not None
