"""mnist2db export --label-db: a database's float targets (its label database)
beside the files (OUT/targets.csv) and in the shards (KEY.json), read back value for value;
the pair checked as verify --label-db checks it (mnist2db.exporting.float_labels)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_labels, write_raw_db
from helpers import make_images, make_labels, write_idx
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db import array_to_datum, convert
from mnist2db.cli.app import cli
from mnist2db.exporting.float_labels import sample_json, targets_json, value_texts
from mnist2db.exporting.image_files.folder import export_files
from mnist2db.exporting.webdataset.shards import export_webdataset
from mnist2db.formats.datum.message import record_keys

pytest.importorskip("webdataset", reason="webdataset is a test dependency (the test extra)")
from test_export_webdataset import read_back  # noqa: E402

#: float32 values that print in every way: the largest, the smallest normal and subnormal,
#: -0, a third (no short decimal), integers, a negative exponent.
HARD = [3.4028235e38, -3.4028235e38, 1.1754944e-38, 1e-45, -0.0, 1 / 3, 7.0, 1e-8, 0.1, -2.5]


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def _rows(count: int, width: int, seed: int = 0) -> np.ndarray:
    """``(count, width)`` float32 values of every magnitude (random bits, no NaN or inf),
    the hard ones first."""
    bits = np.random.default_rng(seed).integers(0, 2**32, (count, width), dtype=np.uint64)
    rows = bits.astype(np.uint32).view(np.float32)
    rows[~np.isfinite(rows)] = 1.5
    flat = rows.reshape(-1)
    flat[: len(HARD)] = np.array(HARD, np.float32)
    return rows


def _pair(tmp_path: Path, count: int = 30, width: int = 4) -> tuple[Path, Path, np.ndarray]:
    images = write_idx(tmp_path / "i-idx3-ubyte", make_images(count, 3, 2))
    labels = write_idx(tmp_path / "l-idx1-ubyte", make_labels(count))
    db = tmp_path / "db"
    convert(images, labels, db)
    rows = _rows(count, width)
    write_labels(tmp_path / "db_labels", rows)
    return db, tmp_path / "db_labels", rows


def _bits(values: object) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


def test_value_texts_are_the_shortest_that_read_back_as_the_float32() -> None:
    values = np.array(HARD, np.float32)
    texts = value_texts(values)
    assert texts[:5] == ["3.4028235e+38", "-3.4028235e+38", "1.1754944e-38", "1e-45", "-0.0"]
    assert texts[5:] == ["0.33333334", "7.0", "1e-08", "0.1", "-2.5"]
    for text, value in zip(texts, values, strict=True):
        assert _bits(float(text)) == _bits(value)
        if "e" not in text and len(text.rstrip("0").split(".")[1]) > 1:  # one digit fewer differs
            shorter = f"{float(text):.{len(text.split('.')[1]) - 1}f}"
            assert _bits(float(shorter)) != _bits(value)
    rows = _rows(2000, 5, seed=3).reshape(-1)
    assert (_bits([float(t) for t in value_texts(rows)]) == _bits(rows)).all()
    weird = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)  # a pycaffe-made record may
    assert targets_json(weird) == "[NaN, Infinity, -Infinity, 1.0]"
    assert json.loads(sample_json({"key": "k"}, 3, weird))["targets"][1:] == [np.inf, -np.inf, 1.0]


def test_files_write_the_targets_beside_the_list(tmp_path: Path) -> None:
    db, labels, rows = _pair(tmp_path)
    out = tmp_path / "out"
    result = run("export", "--to", "files", "--label-db", labels, db, out)
    assert result.exit_code == 0, result.output
    assert "  4 target values a record in targets.csv\n" in result.stderr
    with open(out / "targets.csv", newline="") as stream:
        table = list(csv.reader(stream))
    assert table[0] == ["path", "v0", "v1", "v2", "v3"]
    listed = [line.rsplit(" ", 1)[0] for line in (out / "list.txt").read_text().splitlines()]
    assert [row[0] for row in table[1:]] == listed
    values = np.array([[float(v) for v in row[1:]] for row in table[1:]])
    assert (_bits(values) == _bits(rows)).all()  # every float32 exactly, bit for bit
    assert json.loads((out / "export.json").read_text())["label_db"] == str(labels)
    # The marker counts the table: --overwrite accepts the export as ours.
    again = run("export", "--to", "files", "--label-db", labels, "--overwrite", db, out)
    assert again.exit_code == 0, again.output


def test_a_path_with_a_comma_or_a_quote_is_one_csv_field(tmp_path: Path) -> None:
    """convert_imageset's keys give back their paths, whatever they hold: quoted as CSV does."""
    names = ["a,b.png", 'say "hi".png', "plain.png"]
    keys = [b"%08d_%s" % (i, name.encode()) for i, name in enumerate(names)]
    pixels = np.zeros((1, 2, 2), np.uint8)
    datum = array_to_datum(pixels, label=1).SerializeToString()
    db = write_raw_db(tmp_path / "db", "lmdb", dict.fromkeys(keys, datum))
    rows = np.array([[0.5], [1.5], [2.5]], np.float32)
    write_labels(tmp_path / "db_labels", rows, keys=sorted(keys))
    out = tmp_path / "out"
    export_files(db, out, label_db=tmp_path / "db_labels")
    text = (out / "targets.csv").read_text()
    assert text == 'path,v0\n"a,b.png",0.5\n"say ""hi"".png",1.5\nplain.png,2.5\n'
    with open(out / "targets.csv", newline="") as stream:
        assert [row[0] for row in csv.reader(stream)][1:] == names


def test_shards_hold_the_targets_and_the_key_in_json(tmp_path: Path) -> None:
    db, labels, rows = _pair(tmp_path)
    out = tmp_path / "shards" / "s"
    result = run("export", "--to", "webdataset", "--shard-size", 7, "--label-db", labels, db, out)
    assert result.exit_code == 0, result.output
    assert "  4 target values a record in each KEY.json\n" in result.stderr
    manifest = json.loads(Path(f"{out}.shards.json").read_text())
    assert manifest["label_db"] == os.path.abspath(labels)
    assert manifest["targets"] == ["v0", "v1", "v2", "v3"]
    samples = read_back(Path(f"{out}.shards.json"))  # the webdataset library's reader
    assert len(samples) == 30
    for i, sample in enumerate(samples):
        found = json.loads(sample["json"])
        assert found["key"] == sample["__key__"] == f"{i:08d}"
        assert found["label"] == int(sample["cls"])
        assert (_bits(found["targets"]) == _bits(rows[i])).all()


def test_resume_goes_on_with_the_targets_in_step(tmp_path: Path) -> None:
    """A killed export's state (the manifest lists the first shards, not complete): resumed
    with the label database, the same bytes as an export never killed; without it, refused."""
    db, labels, _ = _pair(tmp_path)
    whole = tmp_path / "whole" / "s"
    export_webdataset(db, whole, shard_size=7, label_db=labels)
    out = tmp_path / "killed" / "s"
    export_webdataset(db, out, shard_size=7, label_db=labels)
    manifest_path = Path(f"{out}.shards.json")
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["shards"][2:]:
        os.unlink(out.parent / entry["name"])
    manifest["shards"], manifest["complete"] = manifest["shards"][:2], False
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    result = run("export", "--to", "webdataset", "--shard-size", 7, "--resume", db, out)
    assert result.stderr == (
        f"Error: {manifest_path}: written with label_db {os.path.abspath(labels)!r}, not None; "
        "cannot resume it (use --overwrite to start again)\n"
    )
    result = run("export", "--to", "webdataset", "--shard-size", 7, "--resume", "--label-db",
                 labels, db, out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "  14 records were in the shards of the killed export" in result.stderr
    assert sorted(os.listdir(out.parent)) == sorted(os.listdir(whole.parent))
    for name in os.listdir(whole.parent):
        assert (out.parent / name).read_bytes() == (whole.parent / name).read_bytes(), name


@pytest.mark.parametrize("to", ["files", "webdataset"])
def test_a_label_database_of_another_count_is_refused_before_any_work(
    tmp_path: Path, to: str
) -> None:
    db, _, rows = _pair(tmp_path)
    short = tmp_path / "short"
    write_labels(short, rows[:29])
    out = tmp_path / "out" / "s"
    result = run("export", "--to", to, "--label-db", short, db, out)
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {short}: 29 label records for the 30 records of {db}: not its label database\n"
    )  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("to", ["files", "webdataset"])
def test_a_pair_that_drifts_is_refused_naming_the_key(tmp_path: Path, to: str) -> None:
    """The same count, another key at record 12: verify --label-db's line; files: nothing
    left under OUT; shards: only those the manifest lists (each complete or absent)."""
    db, _, rows = _pair(tmp_path)
    keys = list(record_keys(0, 30))
    keys[12] = b"00000012a"
    drifted = tmp_path / "drifted"
    write_labels(drifted, rows, keys=keys)
    out = tmp_path / "out" / "s"
    result = run("export", "--to", to, "--shard-size", 5, "--label-db", drifted, db, out) if (
        to == "webdataset") else run("export", "--to", to, "--label-db", drifted, db, out)  # fmt: skip
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {drifted}: key 00000012a at record 12, where {db} holds 00000012\n"
    )  # fmt: skip
    assert run("verify", db, "--label-db", drifted).stderr == result.stderr  # the one check
    if to == "files":
        assert not out.parent.exists()  # nor the parent it made
    else:
        manifest = json.loads(Path(f"{out}.shards.json").read_text())
        assert not manifest["complete"]  # raw records come in batches: here, no shard yet
        listed = sorted(entry["name"] for entry in manifest["shards"])
        assert sorted(os.listdir(out.parent)) == [*listed, "s.shards.json"]  # no temporary


def test_label_db_is_for_files_and_webdataset(tmp_path: Path) -> None:
    db, labels, _ = _pair(tmp_path)
    result = run("export", "--label-db", labels, db, tmp_path / "idx")
    assert result.exit_code == 2
    assert result.stderr.endswith("Error: --label-db is for --to files and --to webdataset\n")
    result = run("export", "--to", "files", "--label-db", db, db, tmp_path / "out")
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {db}: key 00000000: not a label record: a Datum of float_data values "
        "(this one holds image data)\n",
    )  # fmt: skip


def _named_pair(tmp_path: Path, header: str) -> tuple[Path, Path, list[list[float]]]:
    """A database of 5 PNG files made by ``imageset --labels`` from a whitespace table
    whose header is ``header``, and its label database."""
    from PIL import Image

    root = tmp_path / "photos"
    root.mkdir()
    rows = [[float(i), i / 4, -1.5 * i] for i in range(5)]
    lines = [header]
    for i, row in enumerate(rows):
        Image.fromarray(np.full((2, 3), i, np.uint8)).save(root / f"{i}.png")
        lines.append(f"{i}.png " + " ".join(map(repr, row)))
    (tmp_path / "attrs.txt").write_text("\n".join(lines) + "\n")
    db = tmp_path / "db"
    made = run("imageset", "--labels", tmp_path / "attrs.txt", root, db)
    assert made.exit_code == 0, made.output
    return db, tmp_path / "db_labels", rows


def test_the_label_tables_column_names_name_the_exported_targets(tmp_path: Path) -> None:
    """imageset --labels records the header's names in the label database's mnist2db.json;
    export names the CSV's columns and the manifest's targets by them."""
    db, labels, rows = _named_pair(tmp_path, 'path smiling young q"uote')
    recorded = json.loads((labels / "mnist2db.json").read_text())
    assert recorded["targets"] == {"names": ["smiling", "young", 'q"uote']}
    assert recorded["digest"]["records"] == 5  # the digest kept beside the names
    assert run("verify", db, "--label-db", labels).exit_code == 0
    out = tmp_path / "out"
    assert run("export", "--to", "files", "--label-db", labels, db, out).exit_code == 0
    with open(out / "targets.csv", newline="") as stream:
        table = list(csv.reader(stream))
    assert table[0] == ["path", "smiling", "young", 'q"uote']
    assert [[float(v) for v in row[1:]] for row in table[1:]] == rows
    assert (out / "targets.csv").read_text().startswith('path,smiling,young,"q""uote"\n')
    shards = tmp_path / "shards" / "s"
    assert run("export", "--to", "webdataset", "--label-db", labels, db, shards).exit_code == 0
    manifest = json.loads(Path(f"{shards}.shards.json").read_text())
    assert manifest["targets"] == ["smiling", "young", 'q"uote']


def test_names_that_are_not_recorded_or_do_not_fit_give_v0(tmp_path: Path) -> None:
    """Too long to record (beyond NAMES_LIMIT), or recorded for another width: v0 …"""
    from mnist2db.recipe import NAMES_LIMIT

    long = "n" * (NAMES_LIMIT // 2)
    db, labels, _ = _named_pair(tmp_path, f"path {long}a {long}b {long}c")
    assert "targets" not in json.loads((labels / "mnist2db.json").read_text())
    out = tmp_path / "out"
    assert run("export", "--to", "files", "--label-db", labels, db, out).exit_code == 0
    assert (out / "targets.csv").read_text().startswith("path,v0,v1,v2\n")
    recorded = json.loads((labels / "mnist2db.json").read_text())
    recorded["targets"] = {"names": ["only", "two"]}
    (labels / "mnist2db.json").write_text(json.dumps(recorded))
    again = run("export", "--to", "files", "--label-db", labels, "--overwrite", db, out)
    assert again.exit_code == 0, again.output
    assert (out / "targets.csv").read_text().startswith("path,v0,v1,v2\n")


def test_damaged_names_are_refused_in_one_line(tmp_path: Path) -> None:
    db, labels, _ = _named_pair(tmp_path, "path a b c")
    recorded = json.loads((labels / "mnist2db.json").read_text())
    recorded["targets"] = {"names": ["a", 2, "c"]}
    (labels / "mnist2db.json").write_text(json.dumps(recorded))
    result = run("export", "--to", "files", "--label-db", labels, db, tmp_path / "out")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (
        f"Error: {labels / 'mnist2db.json'}: not mnist2db's metadata "
        "(field 'targets.names' is a list, expected a list of names)"
    )
    assert not (tmp_path / "out").exists()


@settings(max_examples=500, deadline=None)
@given(
    st.binary(max_size=40) | st.text(max_size=30).map(str.encode), st.integers(-(2**31), 2**31 - 1)
)
def test_sample_json_is_what_json_dumps_writes(key: bytes, label: int) -> None:
    from mnist2db.exporting.samples import key_fields

    fields = key_fields(key)
    expected = json.dumps({**fields, "label": label}, ensure_ascii=False).encode("utf-8")
    assert sample_json(fields, label, None) == expected
