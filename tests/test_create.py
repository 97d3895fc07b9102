"""mnist2db create and the drop-in scripts: both databases, through the one conversion pipeline."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import record_digest
from helpers import FASHION_DIGESTS, FASHION_DIR, write_idx

from mnist2db.cli.app import cli
from mnist2db.create import create_databases
from mnist2db.errors import IdxFormatError, OutputExistsError
from mnist2db.formats.datum.message import datum_to_array, decode_datum
from mnist2db.storage.databases.backends import detect_backend
from mnist2db.storage.databases.readers import open_reader

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def write_dataset(directory: Path, *, gz: bool = False, train: int = 12, test: int = 7) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    arrays = {}
    for stem, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        suffix = ".gz" if gz else ""
        write_idx(directory / f"{stem}-images-idx3-ubyte{suffix}", images, gz=gz)
        write_idx(directory / f"{stem}-labels-idx1-ubyte{suffix}", labels, gz=gz)
        arrays[stem] = (images, labels)
    return arrays


def read_back(path: Path) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    keys, images, labels = [], [], []
    with open_reader(path) as reader:
        for key, value in reader:
            datum = decode_datum(bytes(value))
            keys.append(bytes(key))
            images.append(datum_to_array(datum)[0])
            labels.append(datum.label)
    return keys, np.array(images), np.array(labels, dtype=np.uint8)


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_create_writes_train_and_test(tmp_path: Path, backend: str) -> None:
    arrays = write_dataset(tmp_path / "data")
    results = create_databases("mnist", tmp_path / "data", tmp_path / "out", backend)
    assert [Path(r.path).name for r in results] == [
        f"mnist_train_{backend}",
        f"mnist_test_{backend}",
    ]
    assert [r.count for r in results] == [12, 7]
    for db, stem in ((f"mnist_train_{backend}", "train"), (f"mnist_test_{backend}", "t10k")):
        assert detect_backend(tmp_path / "out" / db) == backend
        keys, images, labels = read_back(tmp_path / "out" / db)
        assert keys == [b"%08d" % i for i in range(len(keys))]
        np.testing.assert_array_equal(images, arrays[stem][0])
        np.testing.assert_array_equal(labels, arrays[stem][1])


def test_create_goes_through_the_one_conversion_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dataset(tmp_path / "data")
    convert_module = importlib.import_module("mnist2db.conversion")
    create_module = importlib.import_module("mnist2db.create")
    calls = []
    real = convert_module.convert
    assert create_module.convert is real  # create calls the pipeline's own function

    def spy(*args: object, **kwargs: object) -> object:
        calls.append((Path(str(args[0])).name, Path(str(args[2])).name, args[3]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(create_module, "convert", spy)
    create_databases("mnist", tmp_path / "data", tmp_path / "out", "leveldb")
    assert calls == [
        ("train-images-idx3-ubyte", "mnist_train_leveldb", "leveldb"),
        ("t10k-images-idx3-ubyte", "mnist_test_leveldb", "leveldb"),
    ]


def test_create_reads_gz_when_only_that_is_present(tmp_path: Path) -> None:
    arrays = write_dataset(tmp_path / "data", gz=True)
    create_databases("mnist", tmp_path / "data", tmp_path / "out")
    _, images, _ = read_back(tmp_path / "out" / "mnist_test_lmdb")
    np.testing.assert_array_equal(images, arrays["t10k"][0])


def test_cli_create_defaults_follow_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "data" / "mnist")
    write_dataset(tmp_path / "data" / "kmnist", train=3, test=2)
    runner = CliRunner()
    result = runner.invoke(cli, ["create"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith(
        "Wrote examples/mnist/mnist_train_lmdb (lmdb): 12 records of 28x28 in "
    )
    assert lines[1].startswith("Wrote examples/mnist/mnist_test_lmdb (lmdb): 7 records of 28x28")
    assert len(lines) == 2
    result = runner.invoke(cli, ["create", "--dataset", "kmnist", "--backend", "LevelDB", "-q"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert sorted(os.listdir(tmp_path / "examples" / "kmnist")) == [
        "mnist_test_leveldb",
        "mnist_train_leveldb",
    ]
    assert read_back(tmp_path / "examples" / "kmnist" / "mnist_test_leveldb")[2].shape == (2,)


def test_cli_create_missing_input_says_to_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["create", "--dataset", "fashion-mnist"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: data/fashion-mnist/train-images-idx3-ubyte: not found "
        "(run: mnist2db fetch --dataset fashion-mnist)\n"
    )
    result = CliRunner().invoke(cli, ["create", "--data", "elsewhere"])
    assert result.stderr == (
        "Error: elsewhere/train-images-idx3-ubyte: not found "
        "(run: mnist2db fetch --dataset mnist --data elsewhere)\n"
    )
    assert not (tmp_path / "examples").exists()


def test_missing_test_split_writes_nothing(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data")
    (tmp_path / "data" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(IdxFormatError, match="t10k-labels-idx1-ubyte: not found"):
        create_databases("mnist", tmp_path / "data", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_create_existing_output(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data")
    args = ["create", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "-q"]
    runner = CliRunner()
    assert runner.invoke(cli, args).exit_code == 0
    result = runner.invoke(cli, args)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'out' / 'mnist_train_lmdb'}: already exists "
        "(use --overwrite to replace it)\n"
    )
    write_dataset(tmp_path / "data", train=5)
    result = runner.invoke(cli, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert len(read_back(tmp_path / "out" / "mnist_train_lmdb")[0]) == 5


def test_create_never_replaces_a_directory_that_is_not_a_database(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data")
    precious = tmp_path / "out" / "mnist_train_lmdb"
    precious.mkdir(parents=True)
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="holds 'notes.txt' .*; refusing to replace it"):
        create_databases("mnist", tmp_path / "data", tmp_path / "out", overwrite=True)
    assert (precious / "notes.txt").read_text() == "mine"


# -- the drop-in scripts, on Debian's Fashion-MNIST --------------------------------------------


def test_scripts_fetch_and_create_like_caffe(tmp_path: Path) -> None:
    if not all((FASHION_DIR / f"{s}-images-idx3-ubyte.gz").exists() for s in ("train", "t10k")):
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({FASHION_DIR})")
    env = {
        **os.environ,
        "MNIST2DB": f"{sys.executable} -m mnist2db",
        "MNIST2DB_MIRROR": str(FASHION_DIR),  # a plain directory as the mirror
        "DATASET": "fashion-mnist",
        "BACKEND": "leveldb",
    }
    run = subprocess.run(
        ["sh", str(SCRIPTS / "get_mnist.sh"), "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""  # -q: quiet, the script's own lines too
    assert sorted(os.listdir(tmp_path / "data" / "fashion-mnist")) == sorted(
        [".mnist2db.sha256"]
        + [
            f"{s}-{k}"
            for s in ("t10k", "train")
            for k in ("images-idx3-ubyte", "labels-idx1-ubyte")
        ]
    )
    # Caffe's create_mnist.sh removes the old databases first: so does ours (--overwrite).
    stale = tmp_path / "examples" / "fashion-mnist" / "mnist_test_leveldb"
    for args, said in ((["-q"], ""), ([], "Creating leveldb...\nDone.\n")):
        run = subprocess.run(
            ["sh", str(SCRIPTS / "create_mnist.sh"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout == said
    assert detect_backend(stale) == "leveldb"
    assert record_digest(stale) == FASHION_DIGESTS["t10k"]
    train = tmp_path / "examples" / "fashion-mnist" / "mnist_train_leveldb"
    assert record_digest(train)[0] == 60000


def test_scripts_fail_with_set_e(tmp_path: Path) -> None:
    env = {**os.environ, "MNIST2DB": f"{sys.executable} -m mnist2db"}
    run = subprocess.run(
        ["sh", str(SCRIPTS / "create_mnist.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert run.stdout == "Creating lmdb...\n"  # no "Done."
    assert run.stderr == (
        "Error: data/mnist/train-images-idx3-ubyte: not found "
        "(run: mnist2db fetch --dataset mnist --data data/mnist)\n"
    )


# -- EMNIST's orientation, QMNIST's labels --------------------------------------------------


def write_emnist(directory: Path) -> dict:
    """An EMNIST split as fetch stores it: MNIST's names, images transposed, 5 × 3 here."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(8)
    arrays = {}
    for stem, count in (("train", 6), ("t10k", 4)):
        upright = rng.integers(0, 256, size=(count, 5, 3), dtype=np.uint8)
        labels = rng.integers(1, 27, size=count, dtype=np.uint8)
        write_idx(directory / f"{stem}-images-idx3-ubyte", upright.transpose(0, 2, 1).copy())
        write_idx(directory / f"{stem}-labels-idx1-ubyte", labels)
        arrays[stem] = (upright, labels)
    return arrays


def test_create_emnist_writes_upright_images_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    arrays = write_emnist(tmp_path / "data" / "emnist-letters")
    result = CliRunner().invoke(cli, ["create", "--dataset", "emnist-letters"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        "emnist-letters: images are stored transposed; writing them upright "
        "(--as-stored keeps them as stored)."
    )
    keys, images, labels = read_back(tmp_path / "examples/emnist-letters/mnist_train_lmdb")
    np.testing.assert_array_equal(images, arrays["train"][0])  # (6, 5, 3): upright
    np.testing.assert_array_equal(labels, arrays["train"][1])
    info = CliRunner().invoke(cli, ["info", "examples/emnist-letters/mnist_test_lmdb"])
    assert "orientation transposed (height and width swapped)" in info.stdout
    result = CliRunner().invoke(
        cli, ["create", "--dataset", "emnist-letters", "--as-stored", "--overwrite"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        "emnist-letters: images kept as stored (transposed: height and width swapped)."
    )
    _, images, _ = read_back(tmp_path / "examples/emnist-letters/mnist_train_lmdb")
    np.testing.assert_array_equal(images, arrays["train"][0].transpose(0, 2, 1))
    meta = tmp_path / "examples/emnist-letters/mnist_train_lmdb/mnist2db.json"
    assert set(json.loads(meta.read_text())) == {"format", "version", "digest"}  # no options


def test_create_qmnist_writes_train_and_test_with_the_chosen_label_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data" / "qmnist"
    data.mkdir(parents=True)
    rng = np.random.default_rng(4)
    rows = {}
    for stem, count in (("train", 5), ("test", 9)):
        write_idx(
            data / f"qmnist-{stem}-images-idx3-ubyte",
            rng.integers(0, 256, (count, 28, 28), dtype=np.uint8),
        )
        rows[stem] = rng.integers(0, 1000, (count, 8), dtype=np.int32)
        write_idx(data / f"qmnist-{stem}-labels-idx2-int", rows[stem])
    result = CliRunner().invoke(cli, ["create", "--dataset", "qmnist", "--label-column", "2"])
    assert result.exit_code == 0, result.output
    for stem in ("train", "test"):
        with open_reader(tmp_path / f"examples/qmnist/mnist_{stem}_lmdb") as reader:
            got = [decode_datum(bytes(v)).label for _, v in reader]
        assert got == rows[stem][:, 2].tolist()
    result = CliRunner().invoke(
        cli, ["create", "--dataset", "qmnist", "--label-column", "8", "--overwrite"]
    )
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: data/qmnist/qmnist-train-labels-idx2-int: label column 8 does not exist: "
        "the file has 8 columns (0 … 7)\n"
    )


def test_create_shuffles_every_split_with_one_reported_seed(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data")
    results = create_databases("mnist", tmp_path / "data", tmp_path / "out", shuffle=True)
    assert results[0].seed is not None and results[0].seed == results[1].seed
    again = create_databases(
        "mnist", tmp_path / "data", tmp_path / "again", shuffle=True, seed=results[0].seed
    )
    for a, b in zip(results, again, strict=True):
        assert record_digest(Path(a.path)) == record_digest(Path(b.path))
