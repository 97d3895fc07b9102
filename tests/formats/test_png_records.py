"""PNG records read without protobuf, one (PngRecords.read) or a batch (read_many, threads
inflating): the general decoder's image and label wherever they read a record, on records
of either encoder and on hostile ones; the general decoder for everything else."""

from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from os_helpers import in_forked_child
from png_helpers import ENCODERS, hostile_records, image_of, png_of, record, same

from mnist2db import thread_pool
from mnist2db.errors import DatumError
from mnist2db.formats.datum.message import decode_datum
from mnist2db.formats.imdecode.png_decoder import decode_datum_image
from mnist2db.formats.png.encoder import PNG_COMPRESSIONS, encode_png_batch
from mnist2db.reading.png_datums import PngRecords
from mnist2db.reading.threaded import inflate_many


def general(value: bytes) -> tuple[np.ndarray, int] | str:
    """What the general path gives: protobuf, then decode_datum_image; or its error."""
    try:
        datum = decode_datum(value)
        return decode_datum_image(datum.data, "db: key 00000001"), int(datum.label)
    except DatumError as exc:
        return str(exc)


def layout_of(rows: int = 28, cols: int = 28, encoder: str = "rle") -> PngRecords:
    layout = PngRecords.from_record(record(png_of(image_of(0, rows, cols), encoder), 3, rows, cols))
    assert layout is not None
    return layout


def read_alone_and_in_a_batch(layout: PngRecords, value: bytes) -> list[tuple | None]:
    """read(value), and read_many's answer for value between two good records."""
    good = record(png_of(image_of(9, *layout.shape[1:])), 5, *layout.shape[1:])
    images, labels, misses = layout.read_many([good, value, good], inflate_many)
    assert 0 not in misses and 2 not in misses
    return [layout.read(value), None if 1 in misses else (images[1], labels[1])]


@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_records_of_every_encoder_read_as_the_general_path_reads_them(encoder: str) -> None:
    layout = layout_of(encoder=encoder)
    values = [record(png_of(image_of(seed), encoder), seed % 128) for seed in range(40)]
    images, labels, misses = layout.read_many(values, inflate_many)
    assert misses == [] and images.shape == (40, 1, 28, 28) and images.flags.writeable
    for i, value in enumerate(values):
        same(layout.read(value), general(value))
        same((images[i], labels[i]), general(value))


@pytest.mark.parametrize("compression", PNG_COMPRESSIONS)
def test_records_of_mnist2db_encoders_read_without_the_general_path(compression: str) -> None:
    images = np.stack([image_of(seed) for seed in range(300)])
    labels = np.arange(300) % 10
    values = encode_png_batch(images, labels, compression)
    layout = PngRecords.from_record(values[0])
    assert layout is not None
    found, got, misses = layout.read_many(values, inflate_many)
    assert misses == []
    np.testing.assert_array_equal(found[:, 0], images)
    assert got == labels.tolist()
    image, label = layout.read(values[7])  # type: ignore[misc]
    np.testing.assert_array_equal(image[0], images[7])
    assert label == 7 and image.flags.writeable and image.flags.c_contiguous


@pytest.mark.parametrize("name", list(hostile_records()))
def test_hostile_records_read_as_the_general_path_reads_them_or_not_at_all(name: str) -> None:
    layout = layout_of()
    value = hostile_records()[name]
    expected = general(value)
    for found in read_alone_and_in_a_batch(layout, value):
        if found is not None:
            same(found, expected)
    if name in ("junk after the zlib stream", "label 128 (a 2-byte varint)", "label 300"):
        assert not isinstance(expected, str)  # well formed: the general path reads these


def test_what_every_fast_path_leaves_is_named() -> None:
    layout = layout_of()
    hostile = hostile_records()
    left = [name for name, value in hostile.items() if layout.read(value) is None]
    assert left == [n for n in hostile if n != "junk after the zlib stream"]


def test_a_record_with_a_one_byte_length_varint_reads_beside_two_byte_ones() -> None:
    flat = np.zeros((12, 12), np.uint8)
    noisy = image_of(4, 12, 12)
    short, long = record(png_of(flat), 1, 12, 12), record(png_of(noisy), 2, 12, 12)
    assert short[7] < 0x80 and long[7] >= 0x80  # one byte; two bytes
    for first in (short, long):
        layout = PngRecords.from_record(first)
        assert layout is not None
        for value in (short, long):
            same(layout.read(value), general(value))  # type: ignore[arg-type]
        images, labels, misses = layout.read_many([short, long], inflate_many)
        assert misses == [] and labels == [1, 2]
        np.testing.assert_array_equal(images[:, 0], [flat, noisy])


def test_layouts_that_are_not_read_fast() -> None:
    image = image_of(5)
    assert PngRecords.from_record(record(png_of(np.dstack([image] * 3), colour=2), 1)) is None
    assert PngRecords.from_record(record(png_of(image), 200)) is None
    assert PngRecords.from_record(b"\x08\x01\x10\x1c\x18\x1c\x22\x05hello") is None
    assert PngRecords.from_record(b"") is None
    # a first record whose rows need unfiltering: Pillow's kind of PNG, not ours
    filtered = record(png_of(image, filters=b"\x01" * 28), 1)
    assert PngRecords.from_record(filtered) is None


def test_a_layout_pickles_and_images_of_a_big_image_take_the_general_path() -> None:
    import pickle

    layout = layout_of()
    again = pickle.loads(pickle.dumps(layout))
    value = record(png_of(image_of(8)), 9)
    same(again.read(value), general(value))  # type: ignore[arg-type]
    # 1500x1500 of noise: its stream's worst case is beyond one inflate call's bound (the
    # decoder's ONE_SHOT), so it is the general decoder's (which inflates it within bounds).
    noise = image_of(1, 1500, 1500)
    value = record(png_of(noise, "default"), 1, 1500, 1500)
    assert PngRecords.from_record(value) is None
    flat = record(png_of(np.zeros((1500, 1500), np.uint8), "default"), 1, 1500, 1500)
    layout = PngRecords.from_record(flat)  # one whose stream is small: read here
    assert layout is not None and layout.read(value) is None
    assert layout.read_many([value, flat], inflate_many)[2] == [0]
    assert not isinstance(general(value), str)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from(list(ENCODERS)),
    st.integers(0, 2**32 - 1),
    st.integers(0, 127),
    st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 255)), max_size=3),
)
def test_any_record_with_bytes_changed_reads_as_the_general_path_or_not_at_all(
    rows: int, cols: int, encoder: str, seed: int, label: int, changes: list[tuple[int, int]]
) -> None:
    layout = layout_of(rows, cols, encoder)
    value = bytearray(record(png_of(image_of(seed, rows, cols), encoder), label, rows, cols))
    for position, byte in changes:
        value[position % len(value)] = byte
    expected = general(bytes(value))
    found = read_alone_and_in_a_batch(layout, bytes(value))
    for one in found:
        if one is not None:
            same(one, expected)
    if not changes:
        assert None not in found


# -- inflating on threads ----------------------------------------------------------------


@pytest.mark.parametrize("codes", ["fixed", "dynamic", "large"])
def test_inflate_many_keeps_the_order_and_blanks_what_fails_or_has_another_size(
    codes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    size = 9000 if codes == "large" else 100
    # enough that the pool's thread starts before the calling thread is through, even on a
    # busy machine (~20 ms of work)
    count = 600 if codes == "large" else 2000
    raws = [rng.integers(0, 4, size, dtype=np.uint8).tobytes() for _ in range(count)]
    strategy = zlib.Z_FIXED if codes == "fixed" else zlib.Z_DEFAULT_STRATEGY
    streams = [zlib.compressobj(6, zlib.DEFLATED, 15, 8, strategy) for _ in raws]
    streams = [
        deflate.compress(raw) + deflate.flush() for deflate, raw in zip(streams, raws, strict=True)
    ]
    assert {stream[2] & 6 for stream in streams[:-1]} == {2 if codes == "fixed" else 4}
    streams[3] = b"broken"
    streams[250] = zlib.compress(raws[250][:-1])
    streams[-1] = streams[-1][:-1]
    where: set[str] = set()
    decompress = zlib.decompress

    def watched(data: bytes) -> bytes:
        where.add(threading.current_thread().name)
        return decompress(data)

    monkeypatch.setattr(zlib, "decompress", watched)
    # Whether the pool is given work is the decision under test; whether its thread gets a
    # processor before the calling thread has taken every stream is the scheduler's (on a
    # busy machine it may not), so the submissions are counted, not the threads seen.
    submitted = []
    pool = thread_pool.shared_pool()
    real_submit = pool.submit

    def counted(*args: object, **kwargs: object) -> object:
        submitted.append(1)
        return real_submit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pool, "submit", counted)
    out = inflate_many(streams, size)
    assert out == [b"" if i in (3, 250, count - 1) else raw for i, raw in enumerate(raws)]
    assert inflate_many([], 5) == [] and inflate_many(streams[:2], size) == raws[:2]
    # Threads where each call runs long (dynamic codes, large images), where there are two
    # processors; fixed-Huffman 100-byte streams inflate in the calling thread alone.
    two = len(os.sched_getaffinity(0)) >= 2 if hasattr(os, "sched_getaffinity") else False
    assert bool(submitted) == (codes != "fixed" and two)
    if codes == "fixed" or not two:
        assert where == {threading.current_thread().name}


def test_inflate_many_in_a_forked_child_uses_its_own_threads() -> None:
    streams = [zlib.compress(bytes([i % 256]) * 50) for i in range(400)]
    assert len(inflate_many(streams, 50)) == 400  # the parent's pool exists

    def child() -> str:  # on a thread of the child: a pool of the parent's would hang it
        result: list[int] = []
        thread = threading.Thread(
            target=lambda: result.append(sum(map(len, inflate_many(streams, 50)))), daemon=True
        )
        thread.start()
        thread.join(20)
        return str(result)

    assert in_forked_child(child) == str([400 * 50])
