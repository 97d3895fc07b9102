"""protoc's ``caffe_pb2``, compiled from Caffe's messages as pycaffe ships it, for the tests
that compare mnist2db's bytes with what pycaffe makes and reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
