"""The committed datum_pb2.py is what `make proto` generates, and it loads with the installed runtime."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_module_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            str(ROOT / "proto" / "datum.proto"),
        ],
        check=True,
    )
    generated = (tmp_path / "datum_pb2.py").read_text()
    committed = (ROOT / "src" / "mnist2db" / "datum_pb2.py").read_text()
    assert committed == generated, "src/mnist2db/datum_pb2.py is stale: run `make proto`"


def test_generated_module_loads_with_installed_runtime() -> None:
    module = importlib.import_module("mnist2db.datum_pb2")
    fields = {f.name: (f.number, f.type) for f in module.Datum.DESCRIPTOR.fields}
    descriptor = module.Datum.DESCRIPTOR
    assert descriptor.full_name == "caffe.Datum"
    assert fields == {
        "channels": (1, descriptor.fields_by_name["channels"].TYPE_INT32),
        "height": (2, descriptor.fields_by_name["height"].TYPE_INT32),
        "width": (3, descriptor.fields_by_name["width"].TYPE_INT32),
        "data": (4, descriptor.fields_by_name["data"].TYPE_BYTES),
        "label": (5, descriptor.fields_by_name["label"].TYPE_INT32),
        "float_data": (6, descriptor.fields_by_name["float_data"].TYPE_FLOAT),
        "encoded": (7, descriptor.fields_by_name["encoded"].TYPE_BOOL),
    }
    assert module.Datum().encoded is False
