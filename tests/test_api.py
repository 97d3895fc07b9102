"""The public API is pinned: adding or removing a name is a deliberate change to this list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx

import mnist2db


def test_all_is_pinned() -> None:
    assert mnist2db.__all__ == [
        "ArgumentError",
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
        "OutputError",
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


def test_one_error_class_per_kind_of_failure(tmp_path: Path) -> None:
    """Bad arguments, a refused target, a file that cannot be written: each its own class
    (a batch size was a ValueError here and a Mnist2dbError there; a directory that could
    not be written in was a BackendError, as if LMDB had refused)."""
    images = write_idx(tmp_path / "i", make_images(3))
    labels = write_idx(tmp_path / "l", make_labels(3))
    with pytest.raises(mnist2db.ArgumentError, match="^batch size must be at least 1, got 0$"):
        mnist2db.convert(images, labels, tmp_path / "db", batch_size=0)
    with mnist2db.open_idx(images) as reader, pytest.raises(ValueError, match="batch_size"):
        next(reader.iter_batches(0))  # an ArgumentError is a ValueError too
    with pytest.raises(mnist2db.ArgumentError, match="the destination path is empty"):
        mnist2db.convert(images, labels, "")
    with pytest.raises(mnist2db.ArgumentError, match="a seed orders a shuffle"):
        mnist2db.convert(images, labels, tmp_path / "db", seed=1)
    with pytest.raises(mnist2db.OutputExistsError, match="holds the input"):
        mnist2db.convert(images, labels, tmp_path / "i")
    # /proc/self takes no new entries, whoever runs the test (root included).
    with pytest.raises(mnist2db.OutputError, match=r"^/proc/self/db: cannot write in /proc/\d+: "):
        mnist2db.convert(images, labels, "/proc/self/db")
    mnist2db.convert(images, labels, tmp_path / "db")
    mean = mnist2db.compute_mean(tmp_path / "db")
    with pytest.raises(mnist2db.OutputError, match="^/proc/self/m.binaryproto: cannot write"):
        mnist2db.write_mean(mean, "/proc/self/m.binaryproto")
    assert not issubclass(mnist2db.OutputError, mnist2db.BackendError)


def test_the_version_is_the_one_pyproject_declares() -> None:
    import re

    from mnist2db.version import __version__

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE)
    assert declared is not None
    assert __version__ == declared.group(1) == mnist2db.__version__
