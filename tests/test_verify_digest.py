"""Silent changes: every database mnist2db writes records a digest of its records in
mnist2db.json (the one batch writer, conversion.write_database, computes it), and
``verify DB`` without sources reads every record and compares; a database without one
(Caffe's) is said to have none. The records themselves stay Caffe's, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import click
import numpy as np
import plyvel
import pytest
from click.testing import CliRunner
from db_helpers import flip, record_digest, rewrite_lmdb, write_raw_db
from PIL import Image

from mnist2db import convert
from mnist2db.caffe_tools.convert_imageset import convert_imageset
from mnist2db.caffe_tools.drop_ins import run as convert_mnist_data
from mnist2db.cli.app import cli
from mnist2db.errors import VerifyError
from mnist2db.siamese import convert_siamese
from mnist2db.storage.databases.backends import METADATA_NAME
from mnist2db.storage.record_digest import DIGEST_METHOD
from mnist2db.verify import verify_db


def run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, [str(a) for a in args])


def recorded(db: Path) -> dict:
    return json.loads((db / METADATA_NAME).read_text())["digest"]


def assert_digest_is_the_records(db: Path) -> None:
    count, sha256 = record_digest(db)  # the test's own reading of the records
    assert recorded(db) == {"records": count, "sha256": sha256, "method": DIGEST_METHOD}
    result = run("verify", db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"OK: {db} holds the {count} records written (their digest matches).\n"


@pytest.fixture
def image_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "tree"
    rng = np.random.default_rng(3)
    lines = []
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png"
            )
            lines.append(f"{name}/{i}.png {int(name == 'dog')}\n")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(lines))
    return root, listing


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_writer_records_the_digest_of_what_it_wrote(
    mnist_pair, tmp_path: Path, backend: str, image_tree: tuple[Path, Path], capsys
) -> None:
    images, labels, *_ = mnist_pair(30, 6, 5)
    convert(images, labels, tmp_path / "plain", backend=backend)
    # Without options: the digest alone, and info says so.
    assert set(json.loads((tmp_path / "plain" / METADATA_NAME).read_text())) == {
        "format",
        "version",
        "digest",
    }
    convert(
        images, labels, tmp_path / "options", backend=backend, shuffle=True, seed=3, encoded="png"
    )
    assert json.loads((tmp_path / "options" / METADATA_NAME).read_text())["shuffle"]["seed"] == 3
    convert_siamese(images, labels, tmp_path / "pairs", backend=backend, seed=1)
    assert (
        convert_mnist_data(
            [str(images), str(labels), str(tmp_path / "dropin"), f"--backend={backend}"]
        )
        == 0
    )
    root, listing = image_tree
    assert run("imageset", "--backend", backend, root, tmp_path / "imageset").exit_code == 0
    assert (
        convert_imageset(
            [f"--backend={backend}", f"{root}/", str(listing), str(tmp_path / "caffe_imageset")]
        )
        == 0
    )
    capsys.readouterr()
    for name in ("plain", "options", "pairs", "dropin", "imageset", "caffe_imageset"):
        assert_digest_is_the_records(tmp_path / name)
    assert record_digest(tmp_path / "plain") == record_digest(tmp_path / "dropin")
    info = run("info", tmp_path / "plain")
    assert (
        f"options     not recorded ({METADATA_NAME} holds the records' digest alone)\n"
        in info.stdout
    )


def test_a_changed_byte_is_found_without_the_sources(mnist_pair, tmp_path: Path) -> None:
    images, labels, *_ = mnist_pair(30, 6, 5)
    db = tmp_path / "db"
    convert(images, labels, db)
    rewrite_lmdb(db, flip(b"00000017", 20))  # one pixel, with lmdb itself: LMDB has no checksum
    result = run("verify", db)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"Error: {db}: its 30 records are not the ones written: their sha256 is "
    )
    assert "(a byte changed since; give IMAGES and LABELS to find the record)\n" in result.stderr
    # With the sources, the record and the byte are named, as before.
    named = run("verify", db, images, labels)
    assert named.exit_code == 1 and "key 00000017: field data differs" in named.stderr


def test_a_lost_record_is_found_without_the_sources(mnist_pair, tmp_path: Path) -> None:
    images, labels, *_ = mnist_pair(30, 6, 5)
    db = tmp_path / "db"
    convert(images, labels, db, backend="leveldb")
    handle = plyvel.DB(str(db))
    handle.delete(b"00000029")
    handle.close()
    with pytest.raises(VerifyError) as caught:
        verify_db(db)
    assert (
        str(caught.value)
        == f"{db}: holds 29 records, {METADATA_NAME} records the 30 written: records lost or added since"
    )


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_a_database_caffe_wrote_has_no_digest_and_says_so(tmp_path: Path, backend: str) -> None:
    db = write_raw_db(tmp_path / "caffe", backend, {b"00000000": b"\x08\x01"})
    result = run("verify", db)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"Error: {db}: no digest of its records to check (no {METADATA_NAME}: written by Caffe, "
        "another tool or an mnist2db before 0.9?); give its IMAGES and LABELS to compare it "
        "with its source\n"
    )


def test_verify_takes_both_sources_or_neither(mnist_pair, tmp_path: Path) -> None:
    images, labels, *_ = mnist_pair(3, 6, 5)
    convert(images, labels, tmp_path / "db")
    result = run("verify", tmp_path / "db", images)
    assert result.exit_code == 2 and "give both IMAGES and LABELS, or neither" in result.stderr


def test_a_hostile_digest_field_is_one_line(mnist_pair, tmp_path: Path) -> None:
    images, labels, *_ = mnist_pair(3, 6, 5)
    db = tmp_path / "db"
    convert(images, labels, db)
    meta = json.loads((db / METADATA_NAME).read_text())
    meta["digest"]["sha256"] = "xyz"
    (db / METADATA_NAME).write_text(json.dumps(meta))
    result = run("verify", db)
    assert result.exit_code == 1 and result.stderr == (
        f"Error: {db / METADATA_NAME}: not mnist2db's metadata (field 'digest.sha256' is the "
        'string "xyz", expected 64 hex digits)\n'
    )


def test_isolated_verify_says_what_verify_says(mnist_pair, tmp_path: Path) -> None:
    images, labels, *_ = mnist_pair(30, 6, 5)
    db = tmp_path / "db"
    convert(images, labels, db)
    for sources in ([], [images, labels]):
        alone, isolated = run("verify", db, *sources), run("verify", "--isolated", db, *sources)
        assert (isolated.exit_code, isolated.stdout) == (0, alone.stdout)
    rewrite_lmdb(db, flip(b"00000003", 12))
    for sources in ([], [images, labels]):
        alone, isolated = run("verify", db, *sources), run("verify", "--isolated", db, *sources)
        assert isolated.exit_code == 1 and isolated.stderr == alone.stderr
        assert isolated.stderr.count("\n") == 1


def test_isolated_verify_outlives_a_reader_ended_by_a_signal(mnist_pair, tmp_path: Path) -> None:
    """The child reading is ended by SIGBUS (as a map of a file cut short by another
    process ends it): one line, exit 1, this process unharmed."""
    images, labels, *_ = mnist_pair(30, 6, 5)
    db = tmp_path / "db"
    convert(images, labels, db)
    fifo = tmp_path / "images-fifo"
    os.mkfifo(fifo)  # the child blocks opening it: still running when it is signalled
    found: list[click.testing.Result] = []
    worker = threading.Thread(
        target=lambda: found.append(run("verify", "--isolated", db, fifo, labels))
    )
    worker.start()
    deadline = time.monotonic() + 60
    child = None
    while child is None and time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if int(stat.rpartition(")")[2].split()[1]) == os.getpid() and b"verify" in cmdline:
                child = int(entry)
        time.sleep(0.05)
    assert child is not None
    time.sleep(0.5)  # well inside its blocking open of the FIFO
    os.kill(child, signal.SIGBUS)
    worker.join(60)
    (result,) = found
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"Error: {db}: the reader was ended by SIGBUS while reading it (changed or cut short "
        "by another process as it was read?); this process is unharmed\n"
    )
