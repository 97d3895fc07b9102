"""A database whose files are empty, cut short or not the backend's is refused in one line
naming the file, by every reader, before the backend opens it; nothing in the directory is
created or changed (storage/databases/checks.py)."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from db_helpers import converted

from mnist2db import BackendError, convert, open_db
from mnist2db.caffe_tools.drop_ins import compute_image_mean
from mnist2db.cli.app import cli
from mnist2db.storage.destinations import check_replaceable


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def snapshot(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` and the sha256 of its bytes."""
    return {
        entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
        for entry in sorted(directory.iterdir())
    }


@pytest.fixture
def lmdb_bytes(mnist_pair, tmp_path: Path) -> bytes:
    images, labels, *_ = mnist_pair(20)  # 28 x 28: four records a page
    convert(images, labels, tmp_path / "source")
    return (tmp_path / "source" / "data.mdb").read_bytes()


def _swap_magic(data: bytes) -> bytes:
    edited = bytearray(data)
    edited[16:20] = edited[16:20][::-1]
    return bytes(edited)


def _damage_second_meta(data: bytes) -> bytes:
    edited = bytearray(data)
    edited[4096 + 16 : 4096 + 20] = b"\0\0\0\0"
    return bytes(edited)


def _version(data: bytes) -> bytes:
    edited = bytearray(data)
    edited[20:24] = struct.pack("=I", 999)
    return bytes(edited)


# What data.mdb holds (from a real 20-record database: 4096-byte pages), what is said.
LMDB_CASES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda data: b"", "empty (0 bytes): not an LMDB database"),
    "100-bytes": (
        lambda data: data[:100],
        "100 bytes, shorter than LMDB's two meta pages: not an LMDB database (or one cut short)",
    ),
    "one-page-and-a-half": (
        lambda data: data[:6000],
        "6000 bytes, shorter than LMDB's two meta pages (8192 bytes): a truncated LMDB database",
    ),
    "garbage": (
        lambda data: bytes(range(256)) * 64,
        "not an LMDB data file (no LMDB magic)",
    ),
    "cut-after-its-meta-pages": (
        lambda data: data[:10000],
        "10000 bytes, shorter than the 7 pages of 4096 bytes its meta page records "
        "(28672 bytes): a truncated LMDB database",
    ),
    "second-meta-page-damaged": (
        _damage_second_meta,
        "no LMDB meta page at byte 4096 (its second meta page): a damaged LMDB database",
    ),
    "other-byte-order": (
        _swap_magic,
        "an LMDB data file of the other byte order: LMDB files are not portable between "
        "byte orders",
    ),
    "another-version": (_version, "LMDB data version 999, expected 1"),
}


@pytest.mark.parametrize("case", list(LMDB_CASES))
def test_a_bad_data_mdb_is_named_and_left_alone(
    lmdb_bytes: bytes, tmp_path: Path, case: str
) -> None:
    edit, said = LMDB_CASES[case]
    assert len(lmdb_bytes) == 28672  # the pages the "cut" case names
    db = tmp_path / "d"
    db.mkdir()
    (db / "data.mdb").write_bytes(edit(lmdb_bytes))
    before = snapshot(db)
    message = f"{db / 'data.mdb'}: {said}"

    result = run("info", db)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"Error: {message}\n")
    with pytest.raises(BackendError) as caught:
        open_db(db)
    assert str(caught.value) == message
    assert snapshot(db) == before  # no lock.mdb, nothing changed


def test_every_reader_names_an_empty_data_mdb(mnist_pair, tmp_path: Path, capsys) -> None:
    images, labels, *_ = mnist_pair(4)
    db = tmp_path / "d"
    db.mkdir()
    (db / "data.mdb").touch()
    message = f"{db / 'data.mdb'}: empty (0 bytes): not an LMDB database"
    for args in (
        ["info", db],
        ["show", db],
        ["verify", db, images, labels],
        ["export", db, tmp_path / "out"],
        ["mean", db, tmp_path / "mean.binaryproto"],
    ):
        result = run(*args)
        assert (result.exit_code, result.stderr) == (1, f"Error: {message}\n"), args
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "mean.binaryproto").exists()

    # Caffe's compute_image_mean fails opening, before its "Opened lmdb" line: so does ours.
    capsys.readouterr()
    assert compute_image_mean([str(db), str(tmp_path / "mean.binaryproto")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E"), err
    assert err.endswith(f"] {message}\n")
    assert not (tmp_path / "mean.binaryproto").exists()

    with pytest.raises(Exception) as caught:
        check_replaceable(str(db), "lmdb")
    assert str(caught.value) == (
        f"{db}: does not open as an LMDB database ({message}); refusing to replace it"
    )
    result = run("convert", "--overwrite", images, labels, db)
    assert (result.exit_code, result.stderr) == (
        1,
        f"Error: {db}: does not open as an LMDB database ({message}); refusing to replace it\n",
    )
    assert os.listdir(db) == ["data.mdb"]
    assert (db / "data.mdb").read_bytes() == b""


@pytest.mark.parametrize(
    ("current", "said"),
    [
        (None, "CURRENT: no such file: not a LevelDB database"),
        (b"", "CURRENT: empty (0 bytes): not a LevelDB database"),
        (
            b"hello",
            "CURRENT: does not name a LevelDB manifest (it holds b'hello', expected "
            "MANIFEST-<number> and a newline): not a LevelDB database",
        ),
        (
            b"MANIFEST-000002\n",
            "MANIFEST-000002: no such file (CURRENT names it): a LevelDB database without "
            "its manifest",
        ),
    ],
    ids=["no-current", "empty-current", "garbage-current", "no-manifest"],
)
def test_a_bad_leveldb_directory_is_named_and_left_alone(
    tmp_path: Path, current: bytes | None, said: str
) -> None:
    db = tmp_path / "d"
    db.mkdir()
    if current is not None:
        (db / "CURRENT").write_bytes(current)
    before = snapshot(db)
    message = f"{db}{os.sep}{said}"
    with pytest.raises(BackendError) as caught:
        open_db(db, backend="leveldb")
    assert str(caught.value) == message
    if current is not None:  # found as LevelDB by its CURRENT
        result = run("info", db)
        assert (result.exit_code, result.stderr) == (1, f"Error: {message}\n")
    assert snapshot(db) == before  # LevelDB's LOCK and LOG are not created


def test_an_empty_manifest_is_named(tmp_path: Path) -> None:
    db = tmp_path / "d"
    db.mkdir()
    (db / "CURRENT").write_bytes(b"MANIFEST-000002\n")
    (db / "MANIFEST-000002").touch()
    result = run("info", db)
    assert (result.exit_code, result.stderr) == (
        1,
        f"Error: {db / 'MANIFEST-000002'}: empty (0 bytes): a damaged LevelDB database\n",
    )
    assert sorted(os.listdir(db)) == ["CURRENT", "MANIFEST-000002"]


def test_an_empty_directory_read_as_lmdb_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "d"
    db.mkdir()
    with pytest.raises(BackendError) as caught:
        open_db(db, backend="lmdb")
    assert str(caught.value) == f"{db / 'data.mdb'}: no such file: not an LMDB database"
    assert os.listdir(db) == []


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_good_databases_still_open(mnist_pair, tmp_path: Path, backend: str) -> None:
    db, *_ = converted(mnist_pair, tmp_path, backend=backend, count=40)
    with open_db(db) as dataset:
        assert len(dataset) == 40
