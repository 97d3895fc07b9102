"""The message classes mnist2db builds at run time are what protoc makes of proto/datum.proto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from mnist2db.formats.datum.message import file_descriptor, message_type

ROOT = Path(__file__).resolve().parents[2]


def protoc_command() -> list[str]:
    protoc = shutil.which("protoc")
    if protoc is not None:
        return [protoc]
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        pytest.skip("no protoc (apt-get install protobuf-compiler) and no grpcio-tools")
    return [sys.executable, "-m", "grpc_tools.protoc"]


def test_run_time_descriptor_equals_protoc_output(tmp_path: Path) -> None:
    out = tmp_path / "datum.desc"
    subprocess.run(
        [
            *protoc_command(),
            f"-I{ROOT / 'proto'}",
            f"--descriptor_set_out={out}",
            str(ROOT / "proto" / "datum.proto"),
        ],
        check=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert len(files) == 1
    assert file_descriptor() == files[0], "proto/datum.proto and datum._MESSAGES differ"


def test_messages_have_caffes_fields() -> None:
    datum = message_type("Datum")
    descriptor = datum.DESCRIPTOR
    assert descriptor.full_name == "caffe.Datum"
    assert {f.name: (f.number, f.type) for f in descriptor.fields} == {
        "channels": (1, descriptor.fields_by_name["channels"].TYPE_INT32),
        "height": (2, descriptor.fields_by_name["height"].TYPE_INT32),
        "width": (3, descriptor.fields_by_name["width"].TYPE_INT32),
        "data": (4, descriptor.fields_by_name["data"].TYPE_BYTES),
        "label": (5, descriptor.fields_by_name["label"].TYPE_INT32),
        "float_data": (6, descriptor.fields_by_name["float_data"].TYPE_FLOAT),
        "encoded": (7, descriptor.fields_by_name["encoded"].TYPE_BOOL),
    }
    assert datum().encoded is False
    blob = message_type("BlobProto")
    assert [(f.name, f.number) for f in blob.DESCRIPTOR.fields] == [
        ("shape", 7), ("data", 5), ("diff", 6), ("double_data", 8), ("double_diff", 9),
        ("num", 1), ("channels", 2), ("height", 3), ("width", 4),
    ]  # fmt: skip
    # Packed repeated floats, as Caffe writes a mean file: tag 0x2a, length, little-endian.
    assert blob(data=[1.0]).SerializeToString() == b"\x2a\x04\x00\x00\x80\x3f"
    shape = message_type("BlobShape")(dim=[1, 28])
    assert shape.SerializeToString() == b"\x0a\x02\x01\x1c"


def test_private_pool_leaves_the_default_pool_alone() -> None:
    """pycaffe's caffe_pb2 registers caffe.Datum in the default pool: ours must not."""
    code = (
        "from google.protobuf import descriptor_pool\n"
        "import mnist2db\n"
        "mnist2db.decode_datum(mnist2db.encode_datum(b'a', 1, 1, 1, 1))\n"
        "try:\n"
        "    descriptor_pool.Default().FindMessageTypeByName('caffe.Datum')\n"
        "    print('registered')\n"
        "except KeyError:\n"
        "    print('absent')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "absent"
