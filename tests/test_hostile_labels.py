"""Hostile and careless label inputs: a table row of one value too many in every layout, a
label database whose records are not label records or of other widths, and the float32
extremes ``export`` writes read back by ``imageset`` bit for bit. Real processes (the
installed CLI), real LMDB."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

import mnist2db
from mnist2db.errors import DatumError
from mnist2db.exporting.float_labels import value_texts
from mnist2db.formats.datum.float_datum import encode_targets

#: float32's extremes: ±FLT_MAX, the smallest subnormal (both signs), −0, and ordinary ones.
EXTREMES = np.array(
    [3.4028235e38, -3.4028235e38, 1e-45, -1e-45, -0.0, 0.1, 1.1754944e-38], np.float32
)


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mnist2db"]
    if args[0] == "convert_imageset":  # the drop-in's own script, beside this Python
        command = [str(Path(sys.executable).with_name("convert_imageset"))]
        args = args[1:]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(7)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (5, 6), dtype=np.uint8)).save(root / f"{i}.png")
    return root


def one_line_refusal(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for part in parts:
        assert part in lines[0], lines[0]


#: Each layout with its third row holding one value too many (the file's line 4 or 5).
ONE_TOO_MANY = {
    "csv": ("labels.csv", "path,a,b\n0.png,1,0\n1.png,0,1\n2.png,1,0,1\n3.png,0,0\n", 4),
    "whitespace": ("labels.txt", "path a b\n0.png 1 0\n1.png 0 1\n2.png 1 0 1\n3.png 0 0\n", 4),
    "celeba": ("attrs.txt", "4\na b\n0.png 1 0\n1.png 0 1\n2.png 1 0 1\n3.png 0 0\n", 5),
}


@pytest.mark.parametrize("layout", sorted(ONE_TOO_MANY))
def test_a_table_row_of_one_value_too_many_is_refused_naming_the_line(
    photos: Path, tmp_path: Path, layout: str
) -> None:
    name, text, line = ONE_TOO_MANY[layout]
    table = tmp_path / name
    table.write_text(text)
    out = tmp_path / "db"
    done = cli("imageset", "--labels", table, f"{photos}/", out)
    one_line_refusal(done, f"{table}:{line}: 3 values after the path, expected 2")
    assert not out.exists() and not (tmp_path / "db_labels").exists()
    drop_in = cli("convert_imageset", "--targets=table", f"{photos}/", table, tmp_path / "caffe")
    assert drop_in.returncode == 1, drop_in.stderr
    assert f"{table}:{line}: 3 values after the path, expected 2" in drop_in.stderr
    assert "Traceback" not in drop_in.stderr and not (tmp_path / "caffe").exists()


def test_a_value_list_of_one_value_too_many_is_refused_by_both_front_ends(
    photos: Path, tmp_path: Path
) -> None:
    listing = tmp_path / "values.txt"
    listing.write_text("0.png 1 0\n1.png 0 1\n2.png 1 0 1\n")
    one_line_refusal(cli("imageset", "--list", listing, "--values", 0, f"{photos}/",
                         tmp_path / "db"), f"{listing}:3: more than 2 values")  # fmt: skip
    drop_in = cli("convert_imageset", "--targets=list", f"{photos}/", listing, tmp_path / "c")
    assert drop_in.returncode == 1 and f"{listing}:3: more than 2 values" in drop_in.stderr


def write_pair(photos: Path, tmp_path: Path, rows: int = 6) -> tuple[Path, Path]:
    listing = tmp_path / "values.txt"
    listing.write_text("".join(f"{i}.png {i} 0.5 -1\n" for i in range(rows)))
    out = tmp_path / "db"
    made = cli("imageset", "--list", listing, "--values", 3, f"{photos}/", out)
    assert made.returncode == 0, made.stderr
    return out, tmp_path / "db_labels"


def put(db: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(db), map_size=1 << 24)
    with env.begin(write=True) as txn:
        assert txn.get(key) is not None
        txn.put(key, value)
    env.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\xff\xff\xff", "db_labels: key 00000003_3.png: not a label record: value of 3 "
                          "bytes is not a Datum"),
        (encode_targets([1.0, 2.0]), "db_labels: key 00000003_3.png: holds 2 values, the "
                                     "first record 3"),
        (encode_targets([1.0, 2.0, 3.0, 4.0]), "db_labels: key 00000003_3.png: holds 4 "
                                               "values, the first record 3"),
    ],
)  # fmt: skip
def test_a_bad_label_record_is_named_by_its_database_and_key(
    photos: Path, tmp_path: Path, value: bytes, message: str
) -> None:
    images, labels = write_pair(photos, tmp_path)
    put(labels, b"00000003_3.png", value)
    with mnist2db.open_db(str(images), labels=str(labels)) as db:
        assert db[2][1].tolist() == [2.0, 0.5, -1.0]
        for read in (lambda: db[3], lambda: db.read_range(0, 6), lambda: list(db)):
            with pytest.raises(DatumError) as raised:
                read()
            assert str(raised.value).startswith(f"{labels.parent}/{message}")
    done = cli("verify", images, "--label-db", labels)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{labels}: key 00000003_3.png" in done.stderr


def test_a_first_label_record_that_is_not_one_names_the_key(photos: Path, tmp_path: Path) -> None:
    images, labels = write_pair(photos, tmp_path)
    put(labels, b"00000000_0.png", b"\x0a\xff")
    with pytest.raises(DatumError, match=r"db_labels: key 00000000_0\.png: not a label record"):
        mnist2db.open_db(str(images), labels=str(labels))


def test_the_float32_extremes_export_writes_read_back_bit_for_bit(
    photos: Path, tmp_path: Path
) -> None:
    texts = value_texts(EXTREMES)
    assert texts[:5] == ["3.4028235e+38", "-3.4028235e+38", "1e-45", "-1e-45", "-0.0"]
    listing = tmp_path / "values.txt"
    rows = [np.roll(EXTREMES, i) for i in range(6)]
    listing.write_text("".join(f"{i}.png " + " ".join(value_texts(r)) + "\n"
                               for i, r in enumerate(rows)))  # fmt: skip
    first = tmp_path / "db"
    made = cli("imageset", "--list", listing, "--values", len(EXTREMES), f"{photos}/", first)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "files"
    exported = cli("export", first, folder, "--to", "files", "--label-db", f"{first}_labels")
    assert exported.returncode == 0, exported.stderr
    again = tmp_path / "again"
    back = cli("imageset", "--labels", folder / "targets.csv", f"{folder}/", again)
    assert back.returncode == 0, back.stderr
    with mnist2db.open_db(str(again), labels=f"{again}_labels") as db:
        _, targets = db.read_range()
    assert targets.view(np.uint32).tolist() == [r.view(np.uint32).tolist() for r in rows]
    with mnist2db.open_db(str(first), labels=f"{first}_labels") as db:
        _, original = db.read_range()
    assert original.view(np.uint32).tolist() == targets.view(np.uint32).tolist()


def test_values_that_round_past_float32_are_still_refused(photos: Path, tmp_path: Path) -> None:
    listing = tmp_path / "values.txt"
    # 2^128 − 2^103 is halfway from FLT_MAX to 2^128: a double rounds it to infinity.
    listing.write_text("0.png 1\n1.png 3.4028235677973366e+38\n")
    one_line_refusal(cli("imageset", "--list", listing, "--values", 1, f"{photos}/",
                         tmp_path / "db"),
                     f"{listing}:2: value 1, '3.4028235677973366e+38', does not fit a float32")  # fmt: skip
    listing.write_text("0.png 1\n1.png 3.4028235677973362e+38\n")  # just below: FLT_MAX
    made = cli("imageset", "--list", listing, "--values", 1, f"{photos}/", tmp_path / "ok")
    assert made.returncode == 0, made.stderr
    with mnist2db.open_db(str(tmp_path / "ok"), labels=str(tmp_path / "ok_labels")) as db:
        assert db[1][1].tolist() == [float(np.finfo(np.float32).max)]
