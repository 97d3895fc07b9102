"""Siamese pair databases: each record checked against the source, seeds, balance, errors,
interrupts, the drop-in convert_mnist_siamese_data and scripts/create_mnist_siamese.sh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx

from mnist2db.cli.app import cli
from mnist2db.errors import IdxFormatError, Mnist2dbError, OutputExistsError
from mnist2db.formats.datum.message import decode_datum
from mnist2db.siamese import PAIRS_METHOD, convert_siamese
from mnist2db.storage.databases.backends import METADATA_NAME, detect_backend, is_database_file
from mnist2db.storage.databases.readers import open_reader

ROOT = Path(__file__).resolve().parent.parent
SIAMESE_ENTRY = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import siamese_main; siamese_main()",
]


def records(path: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(path) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


def check_pairs(path: Path, images: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """Every record is a Datum of two source images under Caffe's keys, labelled 1 exactly
    when their labels are equal; returns (records, same-class records)."""
    index = {image.tobytes(): i for i, image in enumerate(images)}
    assert len(index) == len(images)  # random test images are distinct
    rows, cols = images.shape[1:]
    size = rows * cols
    positives = 0
    stored = records(path)
    for n, (key, value) in enumerate(stored):
        assert key == b"%08d" % n
        datum = decode_datum(value)  # real protobuf
        assert (datum.channels, datum.height, datum.width) == (2, rows, cols)
        assert len(datum.data) == 2 * size and not datum.encoded
        i = index[datum.data[:size]]
        j = index[datum.data[size:]]
        assert datum.HasField("label")
        assert datum.label == int(labels[i] == labels[j])
        positives += datum.label
    return len(stored), positives


@pytest.mark.parametrize("backend", ["leveldb", "lmdb"])
def test_pairs_match_the_source(mnist_pair, tmp_path: Path, backend: str) -> None:
    ipath, lpath, images, labels = mnist_pair(300, 6, 5, gz=True)
    result = convert_siamese(ipath, lpath, tmp_path / "db", backend=backend, seed=11, batch_size=64)
    assert detect_backend(tmp_path / "db") == backend
    count, positives = check_pairs(tmp_path / "db", images, labels)
    assert (result.count, result.positives, result.rows, result.cols) == (300, positives, 6, 5)
    assert count == 300 and result.seed == 11
    # Uniform pairs of ten classes: about 10% same-class.
    assert 10 <= positives <= 60


def test_same_seed_same_bytes_other_seed_other_bytes(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(200, 4, 4)
    a = convert_siamese(ipath, lpath, tmp_path / "a", seed=5, batch_size=7)
    convert_siamese(ipath, lpath, tmp_path / "b", seed=5, batch_size=1000)
    convert_siamese(ipath, lpath, tmp_path / "c", seed=6)
    assert records(tmp_path / "a") == records(tmp_path / "b")  # every key and value
    assert records(tmp_path / "a") != records(tmp_path / "c")
    # No seed: a fresh one each run, reported, and reusing it gives the same database.
    d = convert_siamese(ipath, lpath, tmp_path / "d")
    e = convert_siamese(ipath, lpath, tmp_path / "e")
    assert d.seed != e.seed and records(tmp_path / "d") != records(tmp_path / "e")
    convert_siamese(ipath, lpath, tmp_path / "f", seed=d.seed)
    assert records(tmp_path / "d") == records(tmp_path / "f")
    assert a.seed == 5


def test_seeded_output_is_stable(mnist_pair, tmp_path: Path) -> None:
    """The draws are PCG64 raw words: pinned here, so a change in them is noticed."""
    ipath, lpath, *_ = mnist_pair(50, 2, 2)
    convert_siamese(ipath, lpath, tmp_path / "db", seed=1, pairs=4)
    import numpy as np

    words = np.random.PCG64(1).random_raw(8)
    expected = [(int(words[2 * k]) % 50, int(words[2 * k + 1]) % 50) for k in range(4)]
    _, _, images, _ = mnist_pair(50, 2, 2)
    index = {image.tobytes(): i for i, image in enumerate(images)}
    got = [
        (index[decode_datum(v).data[:4]], index[decode_datum(v).data[4:]])
        for _, v in records(tmp_path / "db")
    ]
    assert got == expected


@pytest.mark.parametrize("pairs", [1, 101, 1000])
def test_balanced_gives_exactly_half_same_class(mnist_pair, tmp_path: Path, pairs: int) -> None:
    ipath, lpath, images, labels = mnist_pair(120, 3, 3)
    result = convert_siamese(
        ipath, lpath, tmp_path / "db", seed=2, pairs=pairs, balanced=True, batch_size=33
    )
    count, positives = check_pairs(tmp_path / "db", images, labels)
    assert count == pairs and positives == result.positives == pairs // 2


def test_pairs_option_and_empty(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, labels = mnist_pair(10, 2, 3)
    convert_siamese(ipath, lpath, tmp_path / "many", seed=0, pairs=25)
    assert check_pairs(tmp_path / "many", images, labels)[0] == 25
    convert_siamese(ipath, lpath, tmp_path / "none", pairs=0, backend="lmdb")
    assert records(tmp_path / "none") == []


def test_errors(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(10, 2, 2)
    with pytest.raises(IdxFormatError, match="is it the label file"):
        convert_siamese(lpath, ipath, tmp_path / "x")
    one_class = write_idx(tmp_path / "one-labels", np.zeros(10, dtype=np.uint8))
    with pytest.raises(Mnist2dbError) as info:
        convert_siamese(ipath, one_class, tmp_path / "x", balanced=True)
    assert str(info.value) == (
        f"{one_class}: every item has label 0: balanced pairs need at least two classes"
    )
    empty_i = write_idx(tmp_path / "e-images", np.zeros((0, 2, 2), dtype=np.uint8))
    empty_l = write_idx(tmp_path / "e-labels", np.zeros(0, dtype=np.uint8))
    with pytest.raises(IdxFormatError, match="no images to pair"):
        convert_siamese(empty_i, empty_l, tmp_path / "x", pairs=3)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        convert_siamese(ipath, lpath, tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if "mnist2db-tmp" in p.name] == []


def test_cli_siamese(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, labels = mnist_pair(40, 3, 3)
    out = tmp_path / "pairs_leveldb"
    result = CliRunner().invoke(
        cli, ["siamese", "--seed", "9", "--balanced", str(ipath), str(lpath), str(out)]
    )
    assert result.exit_code == 0, result.output
    first, second = result.stderr.splitlines()
    assert first == "A total of 40 pairs of 3 × 3 images (20 same-class, 50.0%), seed 9."
    assert second.startswith(f"Wrote {out} (leveldb) in ")
    assert detect_backend(out) == "leveldb"
    assert check_pairs(out, images, labels) == (40, 20)
    again = CliRunner().invoke(cli, ["siamese", str(ipath), str(lpath), str(out)])
    assert again.exit_code == 1
    assert again.stderr == f"Error: {out}: already exists (use --overwrite to replace it)\n"
    bad = CliRunner().invoke(cli, ["siamese", "--seed", "-1", str(ipath), str(lpath), "y"])
    assert bad.exit_code == 2


def test_interrupt_leaves_nothing(mnist_pair, tmp_path: Path) -> None:
    """SIGINT once the pairs are written, before the move: exit 130, one line, no database
    and no temporaries (the real signal, delivered at the staging checkpoint)."""
    ipath, lpath, *_ = mnist_pair(50, 4, 4)
    out = tmp_path / "out" / "pairs"
    code = (
        "import os, signal, sys, mnist2db.storage.files as c\n"
        "def stop(stage, staging):\n"
        "    if stage == 'staged':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "c.checkpoint = stop\n"
        "from mnist2db.cli.app import main\n"
        "main(sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "siamese", "-q", str(ipath), str(lpath), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (128 + signal.SIGINT, "Interrupted\n")
    assert not out.exists()
    # The run created out.parent; a failed run removes the directories it created.
    assert not out.parent.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([ipath.name, lpath.name])


def test_drop_in(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, labels = mnist_pair(30, 2, 2)
    out = tmp_path / "mnist_siamese_train_leveldb"
    done = subprocess.run(
        [*SIAMESE_ENTRY, str(ipath), str(lpath), str(out), "--seed=4"],
        capture_output=True,
        text=True,
        check=False,
    )
    # Caffe's siamese tool logs INFO to glog's log file only: nothing on stderr.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert detect_backend(out) == "leveldb"  # Caffe's backend
    convert_siamese(ipath, lpath, tmp_path / "same", seed=4)
    assert records(out) == records(tmp_path / "same")
    assert check_pairs(out, images, labels)[0] == 30
    shown = subprocess.run(
        [*SIAMESE_ENTRY, "--logtostderr", "--backend=lmdb", str(ipath), str(lpath), "x"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    logged = [line.split("] ", 1)[1] for line in shown.stderr.splitlines()]
    assert logged[:2] == ["A total of 30 items.", "Rows: 2 Cols: 2"]
    assert detect_backend(tmp_path / "x") == "lmdb"
    usage = subprocess.run([*SIAMESE_ENTRY, "a"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "by caffe to train a siamese network." in usage.stderr
    bad = subprocess.run(
        [*SIAMESE_ENTRY, "--seed=x", "a", "b", "c"], capture_output=True, text=True, check=False
    )
    assert (bad.returncode, bad.stderr) == (
        1,
        "ERROR: illegal value 'x' specified for int64 flag 'seed'\n",
    )


def test_create_mnist_siamese_script(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "data" / "mnist"
    data.mkdir(parents=True)
    for split, n in (("train", 40), ("t10k", 20)):
        write_idx(data / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 4, 4), np.uint8))
        write_idx(data / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n, np.uint8))
    env = dict(os.environ, SEED="3", MNIST2DB=f"{sys.executable} -m mnist2db")
    # The second run replaces the databases, as Caffe's rm -rf does; -q silences the script too.
    for args, said in (([], "Creating leveldb...\nDone.\n"), (["-q"], "")):
        done = subprocess.run(
            ["sh", str(ROOT / "scripts" / "create_mnist_siamese.sh"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == said
    train = tmp_path / "examples" / "siamese" / "mnist_siamese_train_leveldb"
    test = tmp_path / "examples" / "siamese" / "mnist_siamese_test_leveldb"
    assert len(records(train)) == 40 and len(records(test)) == 20
    convert_siamese(
        data / "train-images-idx3-ubyte", data / "train-labels-idx1-ubyte", tmp_path / "ref", seed=3
    )
    assert records(train) == records(tmp_path / "ref")
    shutil.rmtree(tmp_path / "ref")


def test_create_mnist_siamese_script_takes_dataset(tmp_path: Path) -> None:
    """DATASET= picks data/DATASET and, for a dataset other than MNIST, its own folder
    examples/siamese/DATASET: MNIST's pairs in examples/siamese are never replaced."""
    rng = np.random.default_rng(1)
    data = tmp_path / "data" / "kmnist"
    data.mkdir(parents=True)
    for split, n in (("train", 30), ("t10k", 12)):
        write_idx(data / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 4, 4), np.uint8))
        write_idx(data / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n, np.uint8))
    mnists = tmp_path / "examples" / "siamese" / "mnist_siamese_train_lmdb"
    mnists.mkdir(parents=True)
    (mnists / "mine.txt").write_text("kept")
    env = dict(
        os.environ,
        DATASET="kmnist",
        BACKEND="lmdb",
        SEED="5",
        MNIST2DB=f"{sys.executable} -m mnist2db",
    )
    done = subprocess.run(
        ["sh", str(ROOT / "scripts" / "create_mnist_siamese.sh"), "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    out = tmp_path / "examples" / "siamese" / "kmnist"
    assert sorted(os.listdir(out)) == ["mnist_siamese_test_lmdb", "mnist_siamese_train_lmdb"]
    assert len(records(out / "mnist_siamese_train_lmdb")) == 30
    assert len(records(out / "mnist_siamese_test_lmdb")) == 12
    convert_siamese(
        data / "t10k-images-idx3-ubyte",
        data / "t10k-labels-idx1-ubyte",
        tmp_path / "ref",
        backend="lmdb",
        seed=5,
    )
    assert records(out / "mnist_siamese_test_lmdb") == records(tmp_path / "ref")
    assert os.listdir(mnists) == ["mine.txt"]


def test_the_database_records_what_made_it(mnist_pair, tmp_path: Path) -> None:
    """mnist2db.json holds the sources, seed, pairs and balance: info shows them, the same
    arguments give the same records again; it is a file, never a record."""
    ipath, lpath, images, labels = mnist_pair(60, 3, 3)
    for backend in ("leveldb", "lmdb"):
        out = tmp_path / backend
        convert_siamese(ipath, lpath, out, backend=backend, seed=77, pairs=41, balanced=True)
        meta = json.loads((out / METADATA_NAME).read_text())
        assert meta["source"] == {
            "images": str(ipath),
            "labels": str(lpath),
            "items": 60,
            "label_magic": "0x00000801",
        }
        assert meta["pairs"] == {
            "count": 41,
            "seed": 77,
            "balanced": True,
            "method": PAIRS_METHOD[True],
        }
        # Every key the backend holds is a pair record (Caffe's DataLayer reads them all).
        assert check_pairs(out, images, labels) == (41, 20)
        assert sorted(os.listdir(out)) == sorted(
            [METADATA_NAME, *(n for n in os.listdir(out) if is_database_file(backend, n))]
        )
    shown = CliRunner().invoke(cli, ["info", str(tmp_path / "lmdb")])
    assert shown.exit_code == 0, shown.output
    assert f"source      {ipath} + {lpath} (60 items)\n" in shown.stdout
    assert (
        f"pairs       41 balanced (half same-class), seed 77 ({PAIRS_METHOD[True]})\n"
        in shown.stdout
    )
    repeat = "repeat      mnist2db siamese --seed 77 --pairs 41 --balanced IMAGES LABELS OUT_DB\n"
    assert repeat in shown.stdout
    again = CliRunner().invoke(
        cli,
        ["siamese", "-q", "--seed", "77", "--pairs", "41", "--balanced", "--backend", "lmdb"]
        + [str(ipath), str(lpath), str(tmp_path / "again")],
    )
    assert again.exit_code == 0, again.output
    assert records(tmp_path / "again") == records(tmp_path / "lmdb")
    uniform = convert_siamese(ipath, lpath, tmp_path / "uniform", seed=5)
    meta = json.loads((tmp_path / "uniform" / METADATA_NAME).read_text())
    assert meta["pairs"] == {
        "count": 60,
        "seed": 5,
        "balanced": False,
        "method": PAIRS_METHOD[False],
    }
    assert uniform.seed == 5
    # Its records are pairs, not source items: verify and export say so in one line.
    for command in (
        ["verify", str(tmp_path / "uniform"), str(ipath), str(lpath)],
        ["export", str(tmp_path / "uniform"), str(tmp_path / "exported")],
    ):
        refused = CliRunner().invoke(cli, command)
        assert (refused.exit_code, refused.stderr) == (
            1,
            f"Error: {tmp_path / 'uniform'}: a siamese pair database (60 pairs, seed 5): "
            "its records are pairs of source items, not source items\n",
        )
    assert not (tmp_path / "exported").exists()


def test_a_failure_while_writing_aborts_and_leaves_nothing(mnist_pair, tmp_path: Path) -> None:
    """The shared batch writer aborts on any failure: no database, no staging left."""
    ipath, lpath, *_ = mnist_pair(100, 3, 3)

    class Stop(Exception):
        pass

    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append(done)
        if done >= 40:
            raise Stop

    for backend in ("leveldb", "lmdb"):
        with pytest.raises(Stop):
            convert_siamese(
                ipath, lpath, tmp_path / backend, backend=backend, batch_size=20, progress=progress
            )
        assert seen == [20, 40]
        seen.clear()
    assert sorted(os.listdir(tmp_path)) == sorted([ipath.name, lpath.name])
