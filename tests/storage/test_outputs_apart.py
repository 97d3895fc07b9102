"""An output never lands on an input of the same run, and a target that
cannot be written is refused before any work: one rule, targets.check_apart,
used by every writer (mean, compute_image_mean, show --png, export, convert, siamese)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx
from os_helpers import mounted_tmpfs

from mnist2db import convert
from mnist2db.errors import Mnist2dbError, OutputExistsError
from mnist2db.mean import compute_mean, write_mean
from mnist2db.render import write_png_grid
from mnist2db.siamese import convert_siamese

MNIST2DB = [sys.executable, "-m", "mnist2db"]
MEAN_TOOL = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import mean_main; mean_main()",
]


def _run(argv: list[object], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _snapshot(db: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(db.iterdir())}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    images = write_idx(tmp_path / "train-images-idx3-ubyte", make_images(12, 6, 5))
    labels = write_idx(tmp_path / "train-labels-idx1-ubyte", make_labels(12))
    return images, labels


def _database(pair: tuple[Path, Path], tmp_path: Path, backend: str) -> Path:
    db = tmp_path / f"db_{backend}"
    convert(*pair, db, backend=backend)
    return db


def test_compute_image_mean_onto_the_database_file_is_refused(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """`compute_image_mean db db/data.mdb` exited 0 and the database was gone (MDB_INVALID)."""
    db = _database(pair, tmp_path, "lmdb")
    before = _snapshot(db)
    done = _run([*MEAN_TOOL, "--backend=lmdb", db, db / "data.mdb"])
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.rstrip().endswith(
        f"] {db / 'data.mdb'}: is inside the input {db}; refusing to write there "
        "(write it somewhere else)"
    )
    assert _snapshot(db) == before


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_mean_never_writes_into_the_database_it_reads(
    pair: tuple[Path, Path], tmp_path: Path, backend: str
) -> None:
    """`mnist2db mean ldb ldb/CURRENT --overwrite` replaced LevelDB's CURRENT; a new file in
    the database is refused too (the database would then hold a foreign file)."""
    db = _database(pair, tmp_path, backend)
    before = _snapshot(db)
    own = "CURRENT" if backend == "leveldb" else "lock.mdb"
    for target in (db / own, db / "mean.binaryproto", db / "mean.npy"):
        done = _run([*MNIST2DB, "mean", db, target, "--overwrite"])
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"Error: {target}: is inside the input {db}; refusing to write there "
            "(write it somewhere else)\n"
        )
    assert _snapshot(db) == before


def test_every_name_of_the_database_is_the_database(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Through a symbolic link to the database, a link to a directory holding it, or a
    bind mount of it: still inside the input."""
    db = _database(pair, tmp_path, "leveldb")
    before = _snapshot(db)
    (tmp_path / "alias").symlink_to(db)
    (tmp_path / "up").symlink_to(tmp_path)
    cases = [
        (tmp_path / "alias", db / "m.bp", db / "m.bp", tmp_path / "alias"),
        (db, tmp_path / "alias" / "m.bp", tmp_path / "alias" / "m.bp", db),
        (db, tmp_path / "up" / db.name / "CURRENT", tmp_path / "up" / db.name / "CURRENT", db),
    ]
    for source, target, named, holder in cases:
        done = _run([*MNIST2DB, "mean", source, target, "--overwrite"])
        assert done.returncode == 1
        assert done.stderr == (
            f"Error: {named}: is inside the input {holder}; refusing to write there "
            "(write it somewhere else)\n"
        )
    bind = tmp_path / "bind"
    bind.mkdir()
    if subprocess.run(["mount", "--bind", str(db), str(bind)], capture_output=True).returncode:
        pytest.skip("bind mounts need root")
    try:
        done = _run([*MNIST2DB, "mean", db, bind / "CURRENT", "--overwrite"])
        assert done.returncode == 1
        assert done.stderr == (
            f"Error: {bind / 'CURRENT'}: is inside the input {db}; refusing to write there "
            "(write it somewhere else)\n"
        )
    finally:
        subprocess.run(["umount", str(bind)], check=False)
    assert _snapshot(db) == before


def test_write_mean_knows_its_database(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The Python API: the result names the database it came from, and write_mean refuses it."""
    db = _database(pair, tmp_path, "lmdb")
    before = _snapshot(db)
    result = compute_mean(db)
    with pytest.raises(OutputExistsError) as info:
        write_mean(result, db / "data.mdb", overwrite=True)
    assert str(info.value) == (
        f"{db / 'data.mdb'}: is inside the input {db}; refusing to write there "
        "(write it somewhere else)"
    )
    assert _snapshot(db) == before


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_show_png_never_lands_in_the_database(
    pair: tuple[Path, Path], tmp_path: Path, backend: str
) -> None:
    db = _database(pair, tmp_path, backend)
    before = _snapshot(db)
    own = "LOG" if backend == "leveldb" else "data.mdb"
    for target in (db / own, db / "grid.png"):
        done = _run([*MNIST2DB, "show", db, "--png", target, "--overwrite"])
        assert done.returncode == 1
        assert done.stderr == (
            f"Error: {target}: is inside the input {db}; refusing to write there "
            "(write it somewhere else)\n"
        )
    assert _snapshot(db) == before


def test_show_png_never_replaces_the_labels_it_found(pair: tuple[Path, Path]) -> None:
    """No --labels: the label file found beside the images is an input too."""
    images, labels = pair
    before = labels.read_bytes()
    done = _run([*MNIST2DB, "show", images, "--png", labels, "--overwrite"])
    assert done.returncode == 1
    assert done.stderr == f"Error: {labels}: is the input {labels}; refusing to replace it\n"
    assert labels.read_bytes() == before


def test_write_png_grid_takes_its_inputs(pair: tuple[Path, Path], tmp_path: Path) -> None:
    images, _ = pair
    image = make_images(1, 6, 5)
    with pytest.raises(OutputExistsError, match="is the input"):
        write_png_grid([image], ["#0"], images, overwrite=True, inputs=[images])
    assert images.read_bytes()[:4] == b"\0\0\x08\x03"


def test_siamese_never_replaces_a_database_holding_its_inputs(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    db = tmp_path / "pairs"
    convert_siamese(*pair, db, seed=1)
    inside = [Path(os.link(p, db / f"{p.name}.copy") or db / f"{p.name}.copy") for p in pair]
    before = _snapshot(db)
    done = _run([*MNIST2DB, "siamese", *inside, db, "--overwrite", "--seed", "1"])
    assert done.returncode == 1
    assert done.stderr == (
        f"Error: {db}: holds the input {inside[0]}; refusing to replace it "
        "(write the database somewhere else)\n"
    )
    assert _snapshot(db) == before


# -- a target that cannot be there at the end is refused before the work -------------------


@pytest.mark.parametrize("front", ["mnist2db", "convert_mnist_data"])
def test_a_destination_through_a_missing_directory_is_refused_up_front(
    pair: tuple[Path, Path], tmp_path: Path, front: str
) -> None:
    """`convert I L nodir/../db` converted everything, then failed to move it into place."""
    images, labels = pair
    work = tmp_path / "work"
    work.mkdir()
    argv = (
        [*MNIST2DB, "convert"]
        if front == "mnist2db"
        else [sys.executable, "-c", "from mnist2db.caffe_tools.drop_ins import main; main()"]
    )
    done = _run([*argv, images, labels, "nodir/../db"], cwd=work)
    assert done.returncode == 1
    assert done.stderr.rstrip().endswith(
        "nodir/../db: no directory nodir/.. to write it in (nodir does not exist, and '..' "
        "after it would leave it again: create it first, or name the path without '..')"
    )
    # The drop-in logs none of Caffe's start lines: Caffe fails at its mkdir before them.
    assert done.stderr.count("\n") == 1
    assert sorted(os.listdir(work)) == []  # no staging directory, no database, no nodir


def test_a_file_target_through_a_missing_directory_is_refused(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    db = _database(pair, tmp_path, "lmdb")
    done = _run([*MNIST2DB, "mean", db, "nodir/../mean.binaryproto"], cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "Error: nodir/../mean.binaryproto: no directory nodir/.. to write it in\n"
    )


def test_a_database_through_a_link_and_dot_dot_goes_where_the_kernel_puts_it(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """`link/../db` is the directory beside the link's target, not beside the link: the
    database is staged there too (not staged beside the link, then moved across)."""
    real = tmp_path / "a" / "b"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    done = _run([*MNIST2DB, "convert", "-q", *pair, "link/../db"], cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "a" / "db" / "data.mdb").is_file()
    assert not (tmp_path / "db").exists()


def test_mean_into_a_read_only_directory_is_refused_before_reading(tmp_path: Path) -> None:
    """`mean` into a directory it cannot write in read the whole database first."""
    broken = tmp_path / "db"
    broken.mkdir()
    (broken / "data.mdb").write_bytes(b"not an LMDB file")  # reading it would fail
    with mounted_tmpfs(tmp_path / "ro", "1m") as mount:
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(mount)], capture_output=True, text=True
        )
        if remount.returncode:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        target = mount / "mean.binaryproto"
        for argv in ([*MNIST2DB, "mean", broken, target], [*MEAN_TOOL, broken, target]):
            done = _run(argv)
            assert done.returncode == 1
            assert done.stderr.rstrip().endswith(
                f"{target}: cannot write in {mount} (a read-only file system)"
            )
            assert done.stderr.count("\n") == 1


def test_library_writers_take_bytes_paths(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """compute_mean, write_mean and convert take bytes paths (they raised TypeError)."""
    images, labels = (os.fsencode(p) for p in pair)
    out = os.fsencode(tmp_path / "caf\xe9_db")
    result = convert(images, labels, out)
    assert result.path == os.fsdecode(out) and result.count == 12
    mean = compute_mean(out)
    assert mean.count == 12
    target = os.fsencode(tmp_path / "m\xe9an.npy")
    assert write_mean(mean, target) > 0
    assert os.path.isfile(target)
    siamese = convert_siamese(images, labels, os.fsencode(tmp_path / "p\xe9irs"), seed=3)
    assert siamese.count == 12


def test_a_bad_target_never_reaches_the_inputs(tmp_path: Path) -> None:
    """Every refusal is a one-line Mnist2dbError (never a traceback): an empty target."""
    with pytest.raises(Mnist2dbError, match="the output path is empty"):
        write_png_grid([make_images(1, 2, 2)], ["#0"], "")


def test_a_name_longer_than_the_file_system_takes_is_refused_up_front(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A 300-byte name failed only at the end: convert after the whole conversion ('cannot
    move the finished database into place: [Errno 36] …'), mean after reading the database."""
    db = _database(pair, tmp_path, "lmdb")
    long = "x" * 300
    message = "{}: the name {}… is {} bytes long; the file system takes names of at most 255 bytes"
    work = tmp_path / "work"
    work.mkdir()
    for argv, target, size in (
        (["convert", *pair, long], long, 300),
        (["siamese", *pair, f"sub/{long}"], f"sub/{long}", 300),
        (["mean", db, f"{long}.binaryproto"], f"{long}.binaryproto", 312),
        (["show", db, "--png", f"{long}/grid.png"], f"{long}/grid.png", 300),
        (["export", db, long], f"{long}/db_lmdb-images-idx3-ubyte", 300),
    ):
        done = _run([*MNIST2DB, *argv], cwd=work)
        expected = f"Error: {message.format(target, 'x' * 16, size)}\n"
        assert (done.returncode, done.stderr) == (1, expected), argv
    assert os.listdir(work) == []
