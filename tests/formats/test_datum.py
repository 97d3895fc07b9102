"""The fixed-layout Datum encoder equals protobuf's SerializeToString; pycaffe-style helpers."""

from __future__ import annotations

import numpy as np
import pytest
from db_helpers import serialize
from helpers import make_images
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mnist2db import DatumError, array_to_datum, datum_to_array, decode_datum, encode_datum
from mnist2db.datum_pb2 import Datum
from mnist2db.formats.datum.frames import encode_raw_framed
from mnist2db.formats.datum.message import encode_batch, encode_raw_batch, record_keys
from mnist2db.formats.protowire import encode_varint

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(max_examples=300)
@given(
    data=st.binary(max_size=3000),
    channels=INT32,
    height=INT32,
    width=INT32,
    label=INT32,
)
def test_encode_datum_equals_protobuf(
    data: bytes, channels: int, height: int, width: int, label: int
) -> None:
    reference = Datum(channels=channels, height=height, width=width, data=data, label=label)
    assert encode_datum(data, channels, height, width, label) == reference.SerializeToString()


@settings(max_examples=100, deadline=None)
@given(
    images=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=3, max_dims=3, min_side=0, max_side=40)),
    data=st.data(),
)
def test_encode_batch_equals_protobuf(images: np.ndarray, data: st.DataObject) -> None:
    n, rows, cols = images.shape
    labels = data.draw(hnp.arrays(np.uint8, (n,)))
    values = encode_batch(images, labels)
    assert len(values) == n
    for i in range(n):
        reference = Datum(
            channels=1, height=rows, width=cols, data=images[i].tobytes(), label=int(labels[i])
        )
        assert values[i] == reference.SerializeToString()


def test_mnist_record_layout() -> None:
    pixels = bytes(range(256)) * 3 + bytes(16)
    value = encode_batch(
        np.frombuffer(pixels, np.uint8).reshape(1, 28, 28), np.array([0], np.uint8)
    )[0]
    assert len(value) == 795
    assert value[:9] == bytes.fromhex("0801101c181c229006")
    assert value[9:793] == pixels
    assert value[793:] == b"\x28\x00"  # a label of 0 is still written


def test_varint() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(-1) == b"\xff" * 9 + b"\x01"


def test_decode_datum_round_trip() -> None:
    value = encode_datum(b"\x01\x02\x03\x04", 1, 2, 2, 7)
    datum = decode_datum(value)
    assert (datum.channels, datum.height, datum.width, datum.label) == (1, 2, 2, 7)
    assert datum.data == b"\x01\x02\x03\x04"
    assert datum.encoded is False


def test_decode_datum_rejects_garbage() -> None:
    with pytest.raises(DatumError, match=r"^value of 3 bytes is not a Datum"):
        decode_datum(b"\xff\xff\xff")


@settings(max_examples=50)
@given(arr=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=3, max_dims=3, max_side=6)), label=INT32)
def test_array_datum_round_trip_uint8(arr: np.ndarray, label: int) -> None:
    datum = array_to_datum(arr, label)
    assert datum.label == label
    back = datum_to_array(decode_datum(datum.SerializeToString()))
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)


def test_array_datum_round_trip_float() -> None:
    arr = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    datum = array_to_datum(arr)
    assert not datum.HasField("label")
    assert len(datum.data) == 0
    np.testing.assert_allclose(datum_to_array(datum), arr)


def test_array_to_datum_needs_three_dimensions() -> None:
    with pytest.raises(ValueError, match="3-D"):
        array_to_datum(np.zeros((2, 2), np.uint8))


def test_datum_to_array_checks_length() -> None:
    datum = Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(DatumError, match=r"holds 3 data bytes, shape \(1, 2, 2\) needs 4"):
        datum_to_array(datum)


def test_datum_to_array_returns_a_writable_copy() -> None:
    """As pycaffe's caffe.io.datum_to_array: the caller may change the array."""
    datum = decode_datum(encode_datum(b"\x01\x02\x03\x04", 1, 2, 2, 7))
    array = datum_to_array(datum)
    assert array.flags.writeable and array.flags.owndata
    array[0, 0, 0] = 99
    assert datum.data == b"\x01\x02\x03\x04"


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


@given(
    n=st.integers(1, 12),
    rows=st.integers(0, 30),
    cols=st.integers(0, 30),
    labels=st.lists(st.integers(0, 127), min_size=12, max_size=12),
    start=st.sampled_from([0, 7, 998, 99_999_988]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_raw_framed_is_the_records_framed_as_the_digest_frames_them(
    n: int, rows: int, cols: int, labels: list[int], start: int, seed: int
) -> None:
    """The layout is each record's digest frame in order; the pairs are the records."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=n * rows * cols, dtype=np.uint8)
    raw_labels = bytes(labels[:n])
    encoded = encode_raw_framed(pixels.tobytes(), raw_labels, rows, cols, start)
    assert encoded is not None
    layout, pairs = encoded
    values = encode_raw_batch(pixels.tobytes(), raw_labels, rows, cols)
    keys = list(record_keys(start, n))
    assert pairs == list(zip(keys, values, strict=True))
    frame = b"".join(
        len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v for k, v in pairs
    )
    assert bytes(layout) == frame


def test_encode_raw_framed_leaves_two_byte_labels_and_long_keys_to_encode_raw_batch() -> None:
    pixels = make_images(3, 2, 2).tobytes()
    assert encode_raw_framed(pixels, b"\x01\x80\x02", 2, 2, 0) is None
    assert encode_raw_framed(pixels, b"\x01\x02\x03", 2, 2, 10**8 - 2) is None
    assert encode_raw_framed(pixels, b"\x01\x02\x03", 2, 2, 10**8 - 3) is not None


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
