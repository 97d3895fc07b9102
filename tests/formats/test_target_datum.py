"""Label records (mnist2db.formats.datum.float_datum) are pycaffe's ``array_to_datum`` bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pycaffe_helpers import compile_caffe_pb2

from mnist2db.errors import DatumError
from mnist2db.formats.datum.float_datum import (
    decode_targets,
    encode_target_batch,
    encode_targets,
    target_layout,
    target_value_size,
)
from mnist2db.formats.datum.message import decode_datum, encode_datum

# pycaffe's array_to_datum (python/caffe/io.py), as it is, run on protoc's caffe_pb2.
PYCAFFE = """
import json, sys
import numpy as np
from caffe.proto import caffe_pb2

def array_to_datum(arr, label=None):
    if arr.ndim != 3:
        raise ValueError('Incorrect array shape.')
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tostring()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = label
    return datum

for values in json.load(sys.stdin):
    arr = np.asarray(values, dtype=float).reshape(len(values), 1, 1)
    print(array_to_datum(arr).SerializeToString().hex())
"""


def vectors() -> list[list[float]]:
    """Values of every kind: tags, signs, decimals that round, denormals, the float32
    extremes, widths from 1 to 10,000 (a varint of two bytes)."""
    rng = np.random.default_rng(28)
    fixed = [
        [0.0], [-0.0], [1.0, 0.0, 1.0, 1.0], [-1.0, 1.0] * 20, [0.25, -3.5, 17.0],
        [0.1, 0.2, 0.3], [1e-45, 1.4e-45, 3e-39], [3.4028234663852886e38, -3.4e38],
        [3.4028235e38], [16777217.0, 2.0**24 + 3], [1e-8, 123456.789],
    ]  # fmt: skip
    randoms = [
        (rng.standard_normal(width) * 10.0 ** rng.integers(-30, 30)).tolist()
        for width in (1, 2, 5, 40, 127, 128, 129, 300)
    ]
    return fixed + randoms + [rng.uniform(-1, 1, 10_000).tolist()]


def test_bytes_are_pycaffe_array_to_datum(tmp_path: Path) -> None:
    root = compile_caffe_pb2(tmp_path / "pycaffe")
    cases = vectors()
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", PYCAFFE],
        input=json.dumps(cases),
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    theirs = [bytes.fromhex(line) for line in done.stdout.split()]
    ours = [encode_targets(values) for values in cases]
    assert len(theirs) == len(cases)
    top = float(np.finfo(np.float32).max)
    for values, mine, pycaffe in zip(cases, ours, theirs, strict=True):
        if mine != pycaffe and any(abs(v) > top for v in values):
            # A double just past float32's largest (3.4028235e38) rounds to it in numpy
            # and in newer protobuf; protobuf 3.20 (the floor) stores infinity instead.
            values = [float(np.copysign(np.inf, v)) if abs(v) > top else v for v in values]
            mine = encode_targets(values)
        assert mine == pycaffe, values[:5]
    # Unpacked: one 0x35 tag a value, as proto2 writes a repeated float without [packed].
    assert ours[2] == bytes.fromhex("080410011801350000803f3500000000350000803f350000803f")
    # One batch gives the same bytes as one at a time.
    same_width = [v for v in cases if len(v) == 3]
    assert encode_target_batch(np.array(same_width)) == [encode_targets(v) for v in same_width]


floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(floats32, min_size=3, max_size=3), min_size=0, max_size=20))
def test_batch_round_trip(rows: list[list[float]]) -> None:
    values = np.array(rows, np.float64).reshape(len(rows), 3)
    records = encode_target_batch(values)
    assert len(records) == len(rows)
    for record, row in zip(records, values, strict=True):
        assert len(record) == target_value_size(3)
        assert target_layout(record) == 3
        fast = decode_targets(record, width=3)
        slow = decode_targets(record)
        assert fast.dtype == slow.dtype == np.float32
        assert fast.tobytes() == slow.tobytes() == row.astype(np.float32).tobytes()
        datum = decode_datum(record)
        assert (datum.channels, datum.height, datum.width, datum.HasField("label")) == (
            3,
            1,
            1,
            False,
        )


@given(st.lists(floats32, min_size=1, max_size=300))
def test_round_trip_any_width(values: list[float]) -> None:
    record = encode_targets(values)
    assert decode_targets(record, width=len(values)).tolist() == values
    assert decode_targets(record).tolist() == values


def test_packed_and_other_shapes_read_through_protobuf() -> None:
    from mnist2db.formats.datum.message import datum_type

    datum = datum_type()(channels=1, height=2, width=2)
    datum.float_data.extend([1.0, 2.0, 3.0, 4.5])
    value = datum.SerializeToString()
    assert target_layout(value) is None
    assert decode_targets(value, "db: key 1", width=4).tolist() == [1.0, 2.0, 3.0, 4.5]
    # Packed float_data (a writer that packs it): read alike.
    packed = bytes.fromhex("080110021802") + b"\x32\x10" + np.array([1, 2, 3, 4.5], "<f4").tobytes()
    assert decode_targets(packed, width=4).tolist() == [1.0, 2.0, 3.0, 4.5]


def test_an_image_record_is_not_a_label_record() -> None:
    image = encode_datum(b"\x01\x02", 1, 1, 2, 3)
    with pytest.raises(DatumError) as caught:
        decode_targets(image, "labels_lmdb: key 00000000_a.png")
    assert str(caught.value) == (
        "labels_lmdb: key 00000000_a.png: not a label record: a Datum of float_data values "
        "(this one holds image data)"
    )
    short = encode_targets([1.0, 2.0])[:-3]
    with pytest.raises(DatumError):
        decode_targets(short, "x", width=2)
