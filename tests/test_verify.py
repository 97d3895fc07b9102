"""mnist2db verify: every record compared, the first difference named (verify.py)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from db_helpers import converted, flip, rewrite_lmdb
from helpers import write_idx

from mnist2db import convert
from mnist2db.cli.app import cli


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_verify_passes_on_a_fresh_conversion(mnist_pair, tmp_path: Path, backend: str) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path, backend, gz=True)
    result = run("verify", db, images, labels)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"OK: {db} holds the 25 records of {images} and {labels}.\n"


def test_verify_names_a_changed_data_byte(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, image_array, _ = converted(mnist_pair, tmp_path)
    # 6 × 5 images: the Datum is 08 01 10 06 18 05 22 1e, 30 pixels, 28 <label>.
    rewrite_lmdb(db, flip(b"00000003", 8 + 7))
    source = int(image_array[3, 1, 2])
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {db}: key 00000003: field data differs at byte 7 (row 1, column 2): "
        f"database {source ^ 0x5A}, source {source} ({images} item 3)\n"
    )


@pytest.mark.parametrize(
    ("offset", "field"),
    [(3, "height"), (5, "width"), (1, "channels")],
)
def test_verify_names_a_changed_shape_field(
    mnist_pair, tmp_path: Path, offset: int, field: str
) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, flip(b"00000011", offset))
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    want = {"height": 6, "width": 5, "channels": 1}[field]
    assert result.stderr == (
        f"Error: {db}: key 00000011: field {field} is {want ^ 0x5A}, the source has {want} "
        f"({images} item 11)\n"
    )


def test_verify_names_a_changed_label(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, label_array = converted(mnist_pair, tmp_path)

    def relabel(txn) -> None:
        value = bytearray(txn.get(b"00000020"))
        value[-1] = (label_array[20] + 1) % 10
        txn.put(b"00000020", bytes(value))

    rewrite_lmdb(db, relabel)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: key 00000020: field label is {(label_array[20] + 1) % 10}, "
        f"the source has {label_array[20]} ({images} item 20)\n"
    )


def test_verify_reports_a_value_that_is_not_a_datum(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    rewrite_lmdb(db, lambda txn: txn.put(b"00000000", b"\x08"))
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {db}: key 00000000: value of 1 bytes is not a Datum: ")


def test_verify_reports_missing_records(mnist_pair, tmp_path: Path, backend: str) -> None:
    images, labels, image_array, label_array = mnist_pair(25, 6, 5)
    short_images = write_idx(tmp_path / "short-images", image_array[:20])
    short_labels = write_idx(tmp_path / "short-labels", label_array[:20])
    db = tmp_path / "short_db"
    convert(short_images, short_labels, db, backend=backend)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 20 records, the source has 25 ({images}): 5 missing; "
        "is it the database of another split?\n"
    )
    # The other way round: the database holds records the source does not.
    result = run(
        "verify",
        db,
        write_idx(tmp_path / "i18", image_array[:18]),
        write_idx(tmp_path / "l18", label_array[:18]),
    )
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 20 records, the source has 18 ({tmp_path / 'i18'}): 2 extra; "
        "is it the database of another split?\n"
    )


def test_verify_against_the_other_split_says_so(mnist_pair, tmp_path: Path) -> None:
    """A test database checked against the training files names the first difference (it said 'at key 0')."""
    train_images, train_labels, *_ = mnist_pair(30, stem="train", seed=1)
    test_images, test_labels, *_ = mnist_pair(10, stem="t10k", seed=2)
    db = tmp_path / "mnist_test_lmdb"
    convert(test_images, test_labels, db)
    result = run("verify", db, train_images, train_labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: holds 10 records, the source has 30 ({train_images}): 20 missing; "
        "is it the database of another split?\n"
    )


def test_verify_reports_a_deleted_key(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)

    def replace_key(txn: object) -> None:
        value = txn.get(b"00000005")  # type: ignore[attr-defined]
        txn.delete(b"00000005")  # type: ignore[attr-defined]
        txn.put(b"00000005x", value)  # type: ignore[attr-defined]

    rewrite_lmdb(db, replace_key)
    result = run("verify", db, images, labels)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {db}: key 00000005 missing (the next key is 00000005x)\n"


def test_verify_input_errors(mnist_pair, tmp_path: Path) -> None:
    db, images, labels, _, _ = converted(mnist_pair, tmp_path)
    result = run("verify", db, labels, images)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {labels}: magic 0x00000801, expected 0x00000803")
    (tmp_path / "empty").mkdir()
    result = run("verify", tmp_path / "empty", images, labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'empty'}: neither an LMDB (no data.mdb) nor a LevelDB "
        "(no CURRENT) database\n"
    )
