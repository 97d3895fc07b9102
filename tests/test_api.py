"""The public API is pinned: adding or removing a name is a deliberate change to this list."""

from __future__ import annotations

import subprocess
import sys

import mnist2db


def test_all_is_pinned() -> None:
    assert mnist2db.__all__ == [
        "BackendError",
        "ChecksumError",
        "ConvertResult",
        "DatumDataset",
        "DatumError",
        "DownloadError",
        "IdxFormatError",
        "IdxHeader",
        "MeanResult",
        "Mnist2dbError",
        "OutputExistsError",
        "SiameseResult",
        "__version__",
        "array_to_datum",
        "compute_mean",
        "convert",
        "convert_siamese",
        "datum_to_array",
        "decode_datum",
        "detect_backend",
        "encode_datum",
        "iter_db",
        "open_db",
        "open_idx",
        "open_reader",
        "read_header",
        "read_idx",
        "write_mean",
    ]


def test_every_name_resolves() -> None:
    for name in mnist2db.__all__:
        assert getattr(mnist2db, name) is not None


def test_errors_share_one_root() -> None:
    for name in (
        "BackendError",
        "ChecksumError",
        "DatumError",
        "DownloadError",
        "IdxFormatError",
        "OutputExistsError",
    ):
        assert issubclass(getattr(mnist2db, name), mnist2db.Mnist2dbError)


def test_import_is_light() -> None:
    code = "import sys, mnist2db; print(sorted(m for m in ('numpy', 'lmdb', 'plyvel', 'google.protobuf', 'click') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_convert_is_the_function_whatever_was_imported_first() -> None:
    code = (
        "import mnist2db.conversion, mnist2db.cli.app, mnist2db\n"
        "from mnist2db import convert\n"
        "print(callable(convert), callable(mnist2db.convert), type(convert).__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True True function"
