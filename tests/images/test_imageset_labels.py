"""Label databases from both front ends: ``mnist2db imageset --values/--labels`` and
``convert_imageset --targets``: the same keys in the same order as the images whatever is
skipped or shuffled, the values pycaffe's array_to_datum bytes, both or neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from mnist2db import open_db
from mnist2db.cli.app import cli
from mnist2db.formats.datum.float_datum import encode_targets
from mnist2db.formats.datum.message import decode_datum
from mnist2db.storage.databases.readers import open_reader

DRIVER = Path(__file__).resolve().parents[1] / "fault_driver.py"
ENTRY = [sys.executable, "-c", "from mnist2db.caffe_tools.convert_imageset import main; main()"]
COUNT = 12


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def stored(path: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(path) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


def values_of(i: int) -> list[float]:
    return [float(i % 3), i / 4 - 1.0, -0.1 * i]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """photos/ with COUNT small images (``img N.png``: a space in each name), and
    values.txt listing them with three values each (the first a whole number)."""
    root = tmp_path / "photos"
    root.mkdir()
    rng = np.random.default_rng(28)
    lines = []
    for i in range(COUNT):
        Image.fromarray(rng.integers(0, 256, (4, 3), dtype=np.uint8)).save(root / f"img {i}.png")
        lines.append(f"img {i}.png " + " ".join(repr(v) for v in values_of(i)))
    (tmp_path / "values.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check_pair(out: Path, rows: dict[bytes, int]) -> list[bytes]:
    """OUT and OUT_labels hold the same keys in order, each label record the values of the
    image its key names (``rows``: path -> row), each image's label the first value."""
    images, labels = stored(out), stored(Path(f"{out}_labels"))
    keys = [k for k, _ in images]
    assert keys == [k for k, _ in labels]
    for (key, image), (_, label) in zip(images, labels, strict=True):
        row = rows[key[9:]]
        assert label == encode_targets(values_of(row))
        assert decode_datum(image).label == row % 3  # the image's label: the first value
    return keys


ROWS = {b"img %d.png" % i: i for i in range(COUNT)}


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_values_list_with_a_skipped_image(work: Path, backend: str) -> None:
    (work / "photos" / "img 4.png").write_bytes(b"not a png")
    result = run("imageset", "--list", "values.txt", "--values", 3, "--backend", backend,
                 "photos", "out")  # fmt: skip
    assert result.exit_code == 0, result.output
    keys = check_pair(work / "out", ROWS)
    assert keys == [b"%08d_img %d.png" % (i, i) for i in range(COUNT) if i != 4]
    assert result.stderr.endswith(
        "Wrote out_labels: 11 label records of 3 float values, under the image keys.\n"
    )
    with open_db(work / "out", labels=work / "out_labels") as db:
        image, targets = db[4]
        assert targets.tolist() == np.array(values_of(5), np.float32).tolist()
    verified = run("verify", "out", "--label-db", "out_labels")
    assert verified.exit_code == 0, verified.output


def test_shuffled_pairs_stay_aligned_and_repeat(work: Path) -> None:
    args = ["imageset", "--list", "values.txt", "--values", 0, "--shuffle", "--seed", 3, "photos"]
    assert run(*args, "a").exit_code == 0
    keys = check_pair(work / "a", ROWS)
    assert [k[9:] for k in keys] != sorted(ROWS, key=ROWS.__getitem__)  # shuffled
    assert run(*args, "b").exit_code == 0
    assert stored(work / "a_labels") == stored(work / "b_labels")
    assert stored(work / "a") == stored(work / "b")


def test_a_csv_table_and_celeba_layout(work: Path) -> None:
    names = [f"img {i}.png" for i in range(COUNT)]
    table = "path,a,b,c\n" + "".join(
        f"{n},{','.join(map(repr, values_of(i)))}\n" for i, n in enumerate(names)
    )
    (work / "attrs.csv").write_text(table)
    result = run("imageset", "--labels", "attrs.csv", "photos", "csv_db")
    assert result.exit_code == 0, result.output
    assert "(a, b, c), under the image keys." in result.stderr
    check_pair(work / "csv_db", ROWS)
    celeba = f"{COUNT}\nA B C\n" + "".join(
        f"{n.replace(' ', '_')}  {' '.join(map(repr, values_of(i)))}\n" for i, n in enumerate(names)
    )
    for n in names:
        os.link(work / "photos" / n, work / "photos" / n.replace(" ", "_"))
    (work / "list_attr_celeba.txt").write_text(celeba)
    assert run("imageset", "--labels", "list_attr_celeba.txt", "photos", "celeba").exit_code == 0
    check_pair(work / "celeba", {k.replace(b" ", b"_"): v for k, v in ROWS.items()})


def test_a_regression_target_gives_label_0(work: Path) -> None:
    (work / "reg.txt").write_text("img 0.png 0.5 1\nimg 1.png 2 3\n")
    assert run("imageset", "--list", "reg.txt", "--values", 2, "photos", "r").exit_code == 0
    assert [decode_datum(v).label for _, v in stored(work / "r")] == [0, 2]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--list", "values.txt", "--values", 3, "--to", "idx"], 2 - 1,
         "an idx1 label file holds one label 0-255: labels beyond one go to a database (--to db)"),
        (["--labels", "values.txt", "--list", "values.txt"], 1,
         "--labels names the images itself: give it, or --list (with --values), not both"),
        (["--values", 3], 1, "--values reads a --list of 'PATH V1 … VN' lines: give --list"),
        (["--list", "values.txt", "--values", 4], 1,
         "values.txt:1: value 1, '0.png', is not a number"),
        (["--list", "bad.txt", "--values", 0], 1, "bad.txt:2: value 2, 'nan', is NaN"),
        (["--labels", "values.txt"], 1,
         "values.txt:1: the first line ends in a number, not a column name: a label table begins "
         "with a header row (a list of PATH V1 … VN lines: --list with --values)"),
    ],
)  # fmt: skip
def test_refusals_leave_nothing(work: Path, args: list[object], code: int, message: str) -> None:
    (work / "bad.txt").write_text("img 0.png 1 2\nimg 1.png 1 nan\n")
    before = sorted(os.listdir(work))
    result = run("imageset", *args, "photos", "out")
    assert (result.exit_code, result.stderr) == (code, f"Error: {message}\n")
    assert sorted(os.listdir(work)) == before


def test_an_existing_label_database_is_refused_before_any_work(work: Path) -> None:
    (work / "out_labels").mkdir()
    result = run("imageset", "--list", "values.txt", "--values", 3, "photos", "out")
    assert (result.exit_code, result.stderr) == (
        1, "Error: out_labels: already exists (use --overwrite to replace it)\n"
    )  # fmt: skip
    assert not (work / "out").exists()
    again = run("imageset", "--list", "values.txt", "--values", 3, "--overwrite", "photos", "out")
    assert again.exit_code == 0, again.output
    check_pair(work / "out", ROWS)


def test_a_kill_between_the_two_leaves_neither_after_the_next_run(work: Path) -> None:
    flag = work / "flag"
    argv = ["imageset", "-q", "--list", "values.txt", "--values", 3, "photos", "out"]
    config = {"argv": [str(a) for a in argv], "flag": str(flag), "pause": "databases-first"}
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(config)], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 60
    while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert flag.exists(), proc.communicate()
    proc.kill()
    proc.communicate()
    assert (work / "out").exists() and not (work / "out_labels").exists()  # killed half-way
    # The next writer of either rolls it back first, then writes both.
    result = run("imageset", "--list", "values.txt", "--values", 3, "photos", "out")
    assert result.exit_code == 0, result.output
    check_pair(work / "out", ROWS)
    assert [n for n in os.listdir(work) if ".mnist2db-" in n] == []


def drop_in(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, check=False, cwd=cwd)


def test_convert_imageset_targets(work: Path) -> None:
    done = drop_in("--targets=list", "--shuffle", "--seed=9", "photos/", "values.txt", "db",
                   cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    check_pair(work / "db", ROWS)
    assert done.stderr.splitlines()[-1].endswith(
        "] Wrote db_labels: 12 label records of 3 float values, under the image keys."
    )
    (work / "t.csv").write_text("path,x\n" + "".join(f"img {i}.png,{i % 3}\n" for i in range(3)))
    done = drop_in("--targets=table", "photos/", "t.csv", "tdb", cwd=work)
    assert done.returncode == 0, done.stderr
    assert [v for _, v in stored(work / "tdb_labels")] == [
        encode_targets([i % 3]) for i in range(3)
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--targets=csv"], "--targets is 'list' or 'table', got 'csv'"),
        (["--targets_width=3"], "--targets_width is the width of a --targets=list: give --targets"),
        (["--targets=table", "--targets_width=3"],
         "--targets_width is N ≥ 0 of a --targets=list (a table's header gives its width)"),
        (["--targets=list", "--targets_width=4"],
         "values.txt:1: value 1, '0.png', is not a number"),
    ],
)  # fmt: skip
def test_convert_imageset_targets_refusals(work: Path, flags: list[str], message: str) -> None:
    done = drop_in(*flags, "photos/", "values.txt", "db", cwd=work)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1].split("] ", 1)[1]
    assert last == message
    assert not (work / "db").exists() and not (work / "db_labels").exists()
