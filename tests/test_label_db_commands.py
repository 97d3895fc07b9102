"""info, show and verify on label databases (float_data Datums) and image/label pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_labels
from helpers import make_images, make_labels, write_idx

from mnist2db import convert
from mnist2db.cli.app import cli
from mnist2db.errors import VerifyError
from mnist2db.formats.datum.message import record_keys
from mnist2db.labels.databases import verify_label_db

TARGETS = np.array([[0, 1, 0.5], [1, 0, -2.25], [1, 1, 3], [0, 0, 1e-3]], np.float32)


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    images = write_idx(tmp_path / "i-idx3-ubyte", make_images(4, 3, 2))
    labels = write_idx(tmp_path / "l-idx1-ubyte", make_labels(4))
    out = tmp_path / "db"
    convert(images, labels, out)
    write_labels(tmp_path / "db_labels", TARGETS)
    return out, tmp_path / "db_labels"


def test_info_describes_the_values(pair: tuple[Path, Path]) -> None:
    result = run("info", pair[1])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "datum       3 × 1 × 1 (channels × height × width), float_data" in lines
    at = lines.index("values      3 float_data values a record; min … max of each:")
    assert lines[at + 1] == "            0: 0 … 1  1: 0 … 1  2: -2.25 … 3"
    assert lines[-1] == "valid       yes"


def test_info_lists_at_most_64_columns(tmp_path: Path) -> None:
    write_labels(tmp_path / "wide", np.arange(200, dtype=np.float32).reshape(2, 100))
    lines = run("info", tmp_path / "wide").stdout.splitlines()
    assert "values      100 float_data values a record; min … max of each:" in lines
    assert "            60: 60 … 160  61: 61 … 161  62: 62 … 162  63: 63 … 163" in lines
    assert "            … and 36 more" in lines


def test_show_prints_the_values(pair: tuple[Path, Path]) -> None:
    result = run("show", pair[1], "--count", 2, "--offset", 2)
    assert result.exit_code == 0, result.output
    assert result.stdout == ("#2  key 00000002  values 1 1 3\n#3  key 00000003  values 0 0 0.001\n")
    result = run("show", pair[1], "--png", pair[1].parent / "x.png")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {pair[1]}: record 0: holds 3 float_data values (a label database's record), "
        "not an image: show prints them without --png\n"
    )


def test_verify_a_pair(pair: tuple[Path, Path]) -> None:
    images, labels = pair
    result = run("verify", images, "--label-db", labels)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"OK: {labels} is the label database of {images}: 4 records under the same keys, "
        "3 values each.\n"
    )
    assert verify_label_db(images, labels) == (4, 3)


@pytest.mark.parametrize(
    ("keys", "rows", "message"),
    [
        (None, TARGETS[:3], "{labels}: no label record for the image key 00000003 (record 3: "
         "it holds fewer records than {images})"),
        (record_keys(0, 5), np.vstack([TARGETS, TARGETS[:1]]), "{labels}: key 00000004 (record "
         "4) has no image record in {images} (it holds more records)"),
        ([b"00000000", b"00000001", b"00000002a", b"00000003"], TARGETS, "{labels}: key "
         "00000002a at record 2, where {images} holds 00000002"),
    ],
)  # fmt: skip
def test_verify_names_the_first_key_that_breaks_it(
    tmp_path: Path, pair: tuple[Path, Path], keys, rows, message: str
) -> None:
    images = pair[0]
    labels = tmp_path / "other"
    write_labels(labels, rows, keys=keys)
    expected = message.format(images=images, labels=labels)
    with pytest.raises(VerifyError) as caught:
        verify_label_db(images, labels)
    assert str(caught.value) == expected
    result = run("verify", images, "--label-db", labels)
    assert (result.exit_code, result.stderr) == (1, f"Error: {expected}\n")


def test_verify_other_widths_and_image_records(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    images = pair[0]
    labels = tmp_path / "mixed"
    from mnist2db.conversion import write_database
    from mnist2db.formats.datum.float_datum import encode_targets
    from mnist2db.storage.db_staging import staged_database

    values = [encode_targets([1.0, 2.0, 3.0])] * 3 + [encode_targets([1.0])]
    with staged_database(labels, "lmdb") as staging:
        write_database("lmdb", staging, 20, [values], 4, lambda d, t: None)
    result = run("verify", images, "--label-db", labels)
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {labels}: key 00000003 holds 1 values, the first record 3\n"
    )  # fmt: skip
    result = run("verify", images, "--label-db", images)
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {images}: key 00000000: not a label record: a Datum of float_data values "
        "(this one holds image data)\n",
    )  # fmt: skip


def test_verify_without_sources_checks_the_digest_and_one_source_is_refused(
    pair: tuple[Path, Path],
) -> None:
    # DB alone: the digest mnist2db recorded; IMAGES without LABELS: a usage error.
    result = run("verify", pair[0])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"OK: {pair[0]} holds the ")
    assert result.stdout.endswith(" records written (their digest matches).\n")
    result = run("verify", pair[0], pair[1])
    assert result.exit_code == 2
    assert result.stderr.endswith("Error: give both IMAGES and LABELS, or neither\n")
