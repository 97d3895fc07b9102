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
        "DbInfo",
        "DownloadError",
        "ExportResult",
        "FetchedFile",
        "FilesResult",
        "IdxFormatError",
        "IdxHeader",
        "IdxInfo",
        "ImageError",
        "MeanResult",
        "MissingKeyError",
        "Mnist2dbError",
        "OutputError",
        "OutputExistsError",
        "OwnImagesResult",
        "RecordIndexError",
        "RenderError",
        "ShardsResult",
        "SiameseResult",
        "VerifyError",
        "VerifyResult",
        "__version__",
        "array_to_datum",
        "compute_mean",
        "convert",
        "convert_images",
        "convert_siamese",
        "create_databases",
        "datum_to_array",
        "decode_datum",
        "describe",
        "detect_backend",
        "encode_datum",
        "export_db",
        "export_files",
        "export_webdataset",
        "fetch_dataset",
        "iter_db",
        "mean_image",
        "open_db",
        "open_idx",
        "open_reader",
        "read_header",
        "read_idx",
        "verify_db",
        "verify_label_db",
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


#: Every command and its Python twin; ``show`` draws to the terminal and has none (its
#: records: ``open_db``). The twin takes the command's option names as keywords.
TWINS: dict[str, str | tuple[str, ...]] = {
    "convert": "convert",
    "create": "create_databases",
    "fetch": "fetch_dataset",
    "imageset": "convert_images",
    "info": "describe",
    "verify": ("verify_db", "verify_label_db"),  # by --label-db
    "export": ("export_db", "export_files", "export_webdataset"),  # by --to
    "mean": "mean_image",
    "siamese": "convert_siamese",
}
#: Command-line names the twin spells otherwise: OUT_DB is ``out``; ``--as-stored`` is
#: ``transpose=False`` (None: as the dataset needs); ``--quiet`` is the front end's own.
SPELLED_OTHERWISE = {"out_db": "out", "as_stored": "transpose", "quiet": None}


def test_every_command_has_its_python_twin_with_the_same_keywords() -> None:
    import inspect

    from mnist2db.cli.app import COMMANDS, cli

    assert sorted(COMMANDS) == sorted([*TWINS, "show"])
    for command, twins in TWINS.items():
        named = (twins,) if isinstance(twins, str) else twins
        assert set(named) <= set(mnist2db.__all__)
        click_command = cli.get_command(None, command)  # type: ignore[arg-type]
        assert click_command is not None
        keywords = {k for t in named for k in inspect.signature(getattr(mnist2db, t)).parameters}
        # a command with several twins picks one by --to (verify: by --label-db)
        skipped = {"to"} if len(named) > 1 else set()
        for param in click_command.params:
            name = SPELLED_OTHERWISE.get(param.name or "", param.name)
            if name is not None and name not in skipped:
                assert name in keywords, f"{command}: {param.name} is not a keyword of {twins}"


def test_every_error_a_function_may_raise_is_exported() -> None:
    import inspect

    from mnist2db import errors

    declared = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.Mnist2dbError)
    }
    assert declared <= set(mnist2db.__all__)


def test_the_annotations_ship_with_the_package() -> None:
    root = Path(__file__).resolve().parents[1]
    assert (root / "src" / "mnist2db" / "py.typed").is_file()
    assert 'mnist2db = ["py.typed"]' in (root / "pyproject.toml").read_text()


def test_the_commands_twins_run_from_python(tmp_path: Path) -> None:
    images = write_idx(tmp_path / "images", make_images(6, 4, 3))
    labels = write_idx(tmp_path / "labels", make_labels(6))
    db = tmp_path / "db"
    mnist2db.convert(images, labels, db)
    assert mnist2db.verify_db(db, images, labels).count == 6
    described = mnist2db.describe(db)
    assert isinstance(described, mnist2db.DbInfo) and described.problem is None
    header = mnist2db.describe(images)
    assert isinstance(header, mnist2db.IdxInfo) and header.header.dims == (6, 4, 3)
    exported = mnist2db.export_db(db, tmp_path / "out", prefix="x")
    assert Path(exported.images).read_bytes() == images.read_bytes()
    mean = mnist2db.mean_image(db, tmp_path / "mean.binaryproto")
    assert mean.count == 6 and (tmp_path / "mean.binaryproto").stat().st_size > 0
    with pytest.raises(mnist2db.OutputExistsError):
        mnist2db.mean_image(db, tmp_path / "mean.binaryproto")
    pairs = mnist2db.convert_siamese(images, labels, tmp_path / "pairs", seed=1)
    assert pairs.count == 6 and pairs.seed == 1
    with pytest.raises(mnist2db.RecordIndexError):
        mnist2db.open_db(db)[6]
