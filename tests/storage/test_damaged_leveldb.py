"""A LevelDB database whose log or manifest is damaged is refused in one line by every
reader, with its files left as they were (LevelDB's paranoid checks): without them LevelDB
skipped the damaged log records and wrote the rest into a table, deleting the log. A good
database's records read the same after any number of opens (LevelDB's own recovery does
rewrite its log into a table: docs/guarantees.md)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from db_helpers import record_digest

from mnist2db import BackendError, convert, open_db
from mnist2db.caffe_tools.drop_ins import compute_image_mean
from mnist2db.cli.app import cli

#: LevelDB's text log of what it did, rotated on every open (LOG -> LOG.old): not data.
DIAGNOSTICS = {"LOG", "LOG.old"}


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def data_files(directory: Path) -> dict[str, str]:
    """Every file of the database but LevelDB's text log, and the sha256 of its bytes."""
    return {
        entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
        for entry in sorted(directory.iterdir())
        if entry.name not in DIAGNOSTICS
    }


def only(directory: Path, suffix: str) -> Path:
    (found,) = [entry for entry in directory.iterdir() if entry.name.endswith(suffix)]
    return found


def invert(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def leveldb(mnist_pair, tmp_path: Path) -> Path:
    # 300 records of 28 x 28 in the log (mnist2db's writer leaves them there): 8 blocks.
    images, labels, *_ = mnist_pair(300)
    db = tmp_path / "db"
    convert(images, labels, db, backend="leveldb")
    assert only(db, ".log").stat().st_size > 7 * 32768
    return db


@pytest.mark.parametrize("where", ["first-record", "middle", "last-record"])
def test_a_log_with_a_byte_inverted_is_refused_and_left_as_it_was(
    leveldb: Path, tmp_path: Path, capsys, where: str
) -> None:
    log = only(leveldb, ".log")
    size = log.stat().st_size
    invert(log, {"first-record": 100, "middle": size // 2, "last-record": size - 50}[where])
    before = data_files(leveldb)
    images, labels = tmp_path / "train-images-idx3-ubyte", tmp_path / "train-labels-idx1-ubyte"
    for args in (
        ["info", leveldb],
        ["show", leveldb],
        ["verify", leveldb, images, labels],
        ["export", leveldb, tmp_path / "out"],
        ["mean", leveldb, tmp_path / "mean.binaryproto"],
    ):
        result = run(*args)
        assert result.exit_code == 1, args
        assert result.stderr.startswith(
            f"Error: {leveldb}: cannot open LevelDB database: Corruption"
        )
        assert result.stderr.endswith(
            "(a damaged LevelDB database; its files were left as they were)\n"
        )
        assert result.stderr.count("\n") == 1 and "valid" not in result.stdout, args
        assert data_files(leveldb) == before, args
    with pytest.raises(BackendError, match="Corruption"):
        open_db(leveldb)
    capsys.readouterr()
    assert compute_image_mean([str(leveldb), str(tmp_path / "mean.binaryproto")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert data_files(leveldb) == before
    assert not (tmp_path / "out").exists() and not (tmp_path / "mean.binaryproto").exists()


def test_a_damaged_manifest_is_refused_and_left_as_it_was(leveldb: Path) -> None:
    manifest = only(leveldb, "MANIFEST-000002")
    invert(manifest, manifest.stat().st_size // 2)
    before = data_files(leveldb)
    result = run("info", leveldb)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "cannot open LevelDB database: Corruption" in result.stderr
    assert data_files(leveldb) == before


def test_a_good_database_reads_the_same_records_after_every_open(leveldb: Path) -> None:
    expected = record_digest(leveldb)
    assert expected[0] == 300
    for _ in range(3):
        with open_db(leveldb) as db:
            assert len(db) == 300
        result = run("info", leveldb)
        assert result.exit_code == 0 and "300" in result.stdout
        assert record_digest(leveldb) == expected
    assert os.listdir(leveldb)  # LevelDB's recovery moved the log into a table


def _cut(data: bytes) -> bytes:
    return data[: len(data) - 100]


def _length_past_the_end(data: bytes) -> bytes:
    last = (len(data) - 1) // 32768 * 32768  # the last block's first record header
    return data[: last + 4] + b"\xff\xff" + data[last + 6 :]


def _zeroed_header(data: bytes) -> bytes:
    return data[:32768] + bytes(7) + data[32768 + 7 :]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_cut, "ends inside the record at byte"),
        (_length_past_the_end, "ends inside the record at byte"),
        (_zeroed_header, "a zeroed record header at byte 32768"),
    ],
    ids=["cut-short", "length-past-the-end", "zeroed-header"],
)
def test_a_log_leveldb_would_drop_in_silence_is_refused(leveldb: Path, edit, said: str) -> None:  # type: ignore[no-untyped-def]
    log = only(leveldb, ".log")
    log.write_bytes(edit(log.read_bytes()))
    before = {**data_files(leveldb), **{n: "" for n in DIAGNOSTICS if (leveldb / n).exists()}}
    result = run("info", leveldb)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"Error: {log}: {said}")
    assert result.stderr.endswith(
        ": a damaged LevelDB log (LevelDB would drop the records after it in silence); its "
        "files were left as they were\n"
    )
    # Refused before LevelDB opened it: not even its LOG was touched.
    assert {
        **data_files(leveldb),
        **{n: "" for n in DIAGNOSTICS if (leveldb / n).exists()},
    } == before
