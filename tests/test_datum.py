"""The fixed-layout Datum encoder equals protobuf's SerializeToString; pycaffe-style helpers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mnist2db import DatumError, array_to_datum, datum_to_array, decode_datum, encode_datum
from mnist2db.datum import encode_batch, encode_varint
from mnist2db.datum_pb2 import Datum

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
