"""mnist2db beside pycaffe, in either import order: a real ``caffe_pb2`` compiled by protoc
from a caffe.proto holding Caffe's Datum, BlobShape and BlobProto, imported in one process
with mnist2db, decodes mnist2db's values to the same fields (and mnist2db decodes Caffe's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mnist2db import convert

ROOT = Path(__file__).resolve().parent.parent

# Caffe's caffe.proto, cut down to the messages mnist2db uses, field for field, plus one
# Caffe message mnist2db does not define (it must not matter to either side).
CAFFE_PROTO = (
    (ROOT / "proto" / "datum.proto").read_text()
    + """
message LabelMapItem {
  optional string name = 1;
  optional int32 label = 2;
  optional string display_name = 3;
}
"""
)


def compile_caffe_pb2(tmp_path: Path) -> Path:
    """protoc's caffe_pb2 in tmp_path/caffe/proto, as pycaffe ships it; skip without protoc."""
    package = tmp_path / "caffe" / "proto"
    package.mkdir(parents=True)
    (tmp_path / "caffe" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "caffe.proto").write_text(CAFFE_PROTO)
    protoc = shutil.which("protoc")
    if protoc is not None:
        command = [protoc]
    else:
        try:
            import grpc_tools  # noqa: F401
        except ImportError:
            pytest.skip("no protoc (apt-get install protobuf-compiler) and no grpcio-tools")
        command = [sys.executable, "-m", "grpc_tools.protoc"]
    subprocess.run(
        [*command, f"-I{tmp_path}", f"--python_out={tmp_path}", "caffe/proto/caffe.proto"],
        check=True,
        cwd=tmp_path,
    )
    probe = subprocess.run(
        [sys.executable, "-c", "from caffe.proto import caffe_pb2"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        last = probe.stderr.strip().splitlines()[-1:]
        pytest.skip(f"protoc's code does not load with this protobuf runtime: {last}")
    return tmp_path


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
from mnist2db.formats.datum import message_type
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
