"""mnist2db beside pycaffe, in either import order: a real ``caffe_pb2`` compiled by protoc
from a caffe.proto holding Caffe's Datum, BlobShape and BlobProto, imported in one process
with mnist2db, decodes mnist2db's values to the same fields (and mnist2db decodes Caffe's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pycaffe_helpers import compile_caffe_pb2

from mnist2db import convert

READ = """
import mnist2db
db = mnist2db.open_db(DB)
image, label = db[3]
key, datum = next(iter(mnist2db.iter_db(DB)))
value = mnist2db.encode_datum(bytes(range(6)), 1, 2, 3, 200)
ours = mnist2db.decode_datum(value)
"""

CAFFE = """
from caffe.proto import caffe_pb2
"""

CHECK = """
with mnist2db.open_reader(DB) as reader:  # shares the open dataset's handle
    raw = reader.get(b"00000003")
theirs = caffe_pb2.Datum.FromString(raw)
assert (theirs.channels, theirs.height, theirs.width, theirs.label) == (1, 4, 3, label), theirs
assert theirs.data == image.tobytes()
caffe_datum = caffe_pb2.Datum.FromString(value)
fields = lambda d: (d.channels, d.height, d.width, bytes(d.data), d.label, list(d.float_data), d.encoded)
assert fields(caffe_datum) == fields(ours) == (1, 2, 3, bytes(range(6)), 200, [], False)
# The other way: Caffe's bytes, with float data, through mnist2db.
made = caffe_pb2.Datum(channels=1, height=1, width=2, label=-5)
made.float_data.extend([0.5, -2.0])
back = mnist2db.decode_datum(made.SerializeToString())
assert fields(back) == (1, 1, 2, b"", -5, [0.5, -2.0], False)
assert mnist2db.datum_to_array(back).tolist() == [[[0.5, -2.0]]]
# Caffe's BlobProto and ours agree too (the mean file).
from mnist2db.formats.datum.message import message_type
blob = caffe_pb2.BlobProto(num=1, channels=1, height=1, width=2)
blob.shape.dim.extend([1, 1, 1, 2])
blob.data.extend([1.5, 2.5])
mine = message_type("BlobProto").FromString(blob.SerializeToString())
assert list(mine.shape.dim) == [1, 1, 1, 2] and list(mine.data) == [1.5, 2.5]
assert mine.SerializeToString() == blob.SerializeToString()
assert caffe_pb2.Datum.DESCRIPTOR.file.name == "caffe/proto/caffe.proto"
print("ok", key.decode(), datum.label == db[0][1])
"""


@pytest.mark.parametrize("order", ["caffe first", "mnist2db first"])
def test_beside_pycaffe_in_either_order(mnist_pair, tmp_path: Path, order: str) -> None:
    root = compile_caffe_pb2(tmp_path / "pycaffe")
    ipath, lpath, _, _ = mnist_pair(8, 4, 3)
    db = tmp_path / "db_lmdb"
    convert(ipath, lpath, db, backend="lmdb")
    body = CAFFE + READ if order == "caffe first" else READ + CAFFE
    code = f"DB = {str(db)!r}\n" + body + CHECK
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "00000000", "True"]
