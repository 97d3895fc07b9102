"""mnist2db.json as an attacker writes it: every wrong type, non-JSON number, nesting,
FIFO, device or oversized file is one line naming the file, from info, verify and export;
never a coerced value (``"transpose": "false"`` read as true), a hang or a traceback. And
the options are those of the records read: a database replaced while it is read is never
exported with the other one's shuffle."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx

import mnist2db
from mnist2db.cli.app import cli
from mnist2db.errors import BackendError, Mnist2dbError
from mnist2db.exporting.to_idx import export_db
from mnist2db.info import db_info
from mnist2db.recipe import read_metadata
from mnist2db.storage.databases.readers import open_reader
from mnist2db.verify import verify_db


@pytest.fixture
def shuffled(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, Any]]:
    images = write_idx(tmp_path / "i", np.arange(6 * 4, dtype=np.uint8).reshape(6, 2, 2))
    labels = write_idx(tmp_path / "l", np.arange(6, dtype=np.uint8))
    db = tmp_path / "db"
    mnist2db.convert(images, labels, db, shuffle=True, seed=7, transpose=True, offset=1, count=4)
    return db, images, labels, json.loads((db / "mnist2db.json").read_text())


def edited(metadata: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(metadata))
    *parents, name = path.split(".")
    target = copy
    for parent in parents:
        target = target[parent]
    target[name] = value
    return copy


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("transpose", "false", "field 'transpose' is the string \"false\", expected true or false"),
        ("transpose", 0, "field 'transpose' is the number 0, expected true or false"),
        ("shuffle.seed", 1.5, "field 'shuffle.seed' is the number 1.5, expected a seed, a "
         "whole number from 0 to 2^64-1"),
        ("shuffle.seed", -1, "field 'shuffle.seed' is the number -1, expected a seed, a whole "
         "number from 0 to 2^64-1"),
        ("shuffle.seed", 2**64, f"field 'shuffle.seed' is the number {2**64}, expected a seed, "
         "a whole number from 0 to 2^64-1"),
        ("source.images", 5, "field 'source.images' is the number 5, expected a string"),
        ("source.items", True, "field 'source.items' is true, expected a whole number, 0 or more"),
        ("source.items", 3, "items 1 … 4 are past the source's 3"),
        ("offset", "1", "field 'offset' is the string \"1\", expected a whole number, 0 or more"),
        ("count", None, "field 'count' is null, expected a whole number, 0 or more"),
        ("label_column", [0], "field 'label_column' is a list, expected a whole number, 0 or more"),
        ("shuffle", 7, "field 'shuffle' is the number 7, expected an object or null"),
        ("source", "x", "field 'source' is the string \"x\", expected an object"),
        ("encoded", "jpeg", "unknown encoding the string \"jpeg\""),
        ("png_compression", "huge", "unknown PNG compression the string \"huge\""),
        ("version", 2, "unknown format or version"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_one_line_naming_the_file(
    shuffled: tuple[Path, Path, Path, dict[str, Any]], field: str, value: Any, why: str
) -> None:
    db, images, labels, metadata = shuffled
    meta = db / "mnist2db.json"
    meta.write_text(json.dumps(edited(metadata, field, value)))
    message = f"{meta}: not mnist2db's metadata ({why})"
    for read in (
        lambda: db_info(db),
        lambda: verify_db(db, images, labels),
        lambda: export_db(db, db.parent / "out", prefix="x"),
    ):
        with pytest.raises(Mnist2dbError) as caught:
            read()
        assert str(caught.value) == message
    result = CliRunner().invoke(cli, ["info", str(db)])
    assert result.exit_code == 1 and result.stderr == f"Error: {message}\n"
    assert not (db.parent / "out").exists()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('"items": Infinity', "not JSON: Infinity is not a number JSON allows"),
        ('"items": NaN', "not JSON: NaN is not a number JSON allows"),
        ('"items": -Infinity', "not JSON: -Infinity is not a number JSON allows"),
        ('"items": 1e999', "field 'source.items' is the number inf, expected a whole number, 0 or more"),
        ('"items": ' + "9" * 5000, "not JSON: Exceeds the limit (4300 digits) for integer string "
         "conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit"),
    ],
)  # fmt: skip
def test_numbers_json_does_not_allow_are_refused(
    shuffled: tuple[Path, Path, Path, dict[str, Any]], text: str, why: str
) -> None:
    db, _, _, _ = shuffled
    meta = db / "mnist2db.json"
    meta.write_text(meta.read_text().replace('"items": 6', text))
    with pytest.raises(Mnist2dbError) as caught:
        db_info(db)
    assert str(caught.value) == f"{meta}: not mnist2db's metadata ({why})"


def test_deep_nesting_and_a_large_file_are_refused_in_one_line(
    shuffled: tuple[Path, Path, Path, dict[str, Any]],
) -> None:
    db, _, _, _ = shuffled
    meta = db / "mnist2db.json"
    meta.write_text("[" * 60000)
    with pytest.raises(Mnist2dbError) as caught:
        db_info(db)
    assert str(caught.value) == (
        f"{meta}: not mnist2db's metadata (not JSON mnist2db writes: nested too deeply)"
    )
    meta.write_text("[" * 200_000)  # the 200 kB
    with pytest.raises(Mnist2dbError) as caught:
        db_info(db)
    assert str(caught.value) == f"{meta}: cannot read mnist2db's metadata: larger than 65536 bytes"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_metadata_file_that_is_not_a_regular_file_is_never_read(
    shuffled: tuple[Path, Path, Path, dict[str, Any]], kind: str
) -> None:
    """A FIFO hung info (no writer ever comes); a symlink to /dev/zero read until MemoryError."""
    db, images, labels, _ = shuffled
    meta = db / "mnist2db.json"
    meta.unlink()
    if kind == "fifo":
        os.mkfifo(meta)
        what = "a FIFO"
    elif kind == "dev-zero":
        meta.symlink_to("/dev/zero")
        what = "a character device"
    else:
        meta.mkdir()
        what = "a directory"
    message = f"{meta}: cannot read mnist2db's metadata: not a regular file ({what})"
    result: list[BaseException] = []

    def run() -> None:
        try:
            verify_db(db, images, labels)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "verify hangs on the metadata file"
    assert [str(e) for e in result] == [message]
    cli_result = CliRunner().invoke(cli, ["export", str(db), str(db.parent / "out")])
    assert cli_result.exit_code == 1 and cli_result.stderr == f"Error: {message}\n"


# -- one version -----------------------------------------------------------------------------


def test_records_and_options_are_read_as_one_version(tmp_path: Path) -> None:
    """A reader reads the options of the directory whose records it reads (A), whatever
    the path names meanwhile; when A's options are gone (convert --overwrite removes the
    database it replaced), it says so instead of reading A's shuffled records unshuffled."""
    images = write_idx(tmp_path / "i", np.arange(5 * 4, dtype=np.uint8).reshape(5, 2, 2))
    labels = write_idx(tmp_path / "l", np.arange(5, dtype=np.uint8))
    db = tmp_path / "db"
    mnist2db.convert(images, labels, db, shuffle=True, seed=1)
    reader = open_reader(db)
    records = [value for _, value in reader]
    found = read_metadata(reader)
    assert found is not None and found[0].seed == 1
    os.rename(db, tmp_path / "aside")  # A moved away whole, B put in its place
    mnist2db.convert(images, labels, db, shuffle=True, seed=2)
    found = read_metadata(reader)
    assert found is not None and found[0].seed == 1  # still A's, with A's records
    assert [value for _, value in reader] == records
    reader.close()
    reader = open_reader(db)  # B
    mnist2db.convert(images, labels, db, shuffle=True, seed=3, overwrite=True)  # C; B removed
    with pytest.raises(BackendError) as caught:
        read_metadata(reader)
    assert str(caught.value) == (
        f"{db}: the database was replaced while it was being read (convert --overwrite?); "
        "open it again"
    )
    reader.close()
    found = read_metadata(db)
    assert found is not None and found[0].seed == 3


def test_export_during_overwrite_loops_never_mixes_versions(tmp_path: Path) -> None:
    """The issue's loop: one thread exports while another converts --overwrite with a
    different shuffle, over and over. Every export succeeds with the source's bytes
    (each version put back in source order with its own seed), or fails in one line."""
    rng = np.random.default_rng(5)
    array = rng.integers(0, 256, (300, 4, 4), dtype=np.uint8)
    images = write_idx(tmp_path / "i", array)
    labels = write_idx(tmp_path / "l", rng.integers(0, 10, 300, dtype=np.uint8))
    db = tmp_path / "db"
    mnist2db.convert(images, labels, db, shuffle=True, seed=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def overwrite() -> None:
        seed = 1
        while not stop.is_set():
            try:
                mnist2db.convert(images, labels, db, shuffle=True, seed=seed, overwrite=True)
            except BaseException as exc:
                errors.append(exc)
                return
            seed += 1

    writer = threading.Thread(target=overwrite)
    writer.start()
    exported = failed = 0
    try:
        for _ in range(60):
            try:
                result = export_db(db, tmp_path / "out", prefix="x", overwrite=True)
            except Mnist2dbError as exc:
                assert "\n" not in str(exc)
                failed += 1
                continue
            assert Path(result.images).read_bytes() == images.read_bytes()
            assert Path(result.labels).read_bytes() == labels.read_bytes()
            exported += 1
    finally:
        stop.set()
        writer.join()
    assert errors == [] and exported > 0
