"""convert(): real LMDB and LevelDB databases read back and decoded; output safety."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np
import plyvel
import pytest
from db_helpers import serialize
from helpers import make_images, make_labels, write_idx

from mnist2db import BackendError, IdxFormatError, OutputExistsError, convert, iter_db
from mnist2db.datum_pb2 import Datum
from mnist2db.storage.databases.readers import open_reader


def read_records(path: Path, backend: str) -> list[tuple[bytes, bytes]]:
    if backend == "lmdb":
        env = lmdb.open(os.fsencode(path), readonly=True, lock=False)
        with env.begin() as txn:
            records = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        env.close()
        return records
    db = plyvel.DB(os.fsencode(path), create_if_missing=False)
    records = list(db.iterator())
    db.close()
    return records


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".mnist2db-tmp-" in p.name]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize("gz", [False, True])
def test_records_are_caffe_datums(mnist_pair, tmp_path: Path, backend: str, gz: bool) -> None:
    ipath, lpath, images, labels = mnist_pair(25, 28, 28, gz=gz)
    out = tmp_path / "db"
    result = convert(ipath, lpath, out, backend=backend)
    assert (result.count, result.rows, result.cols, result.backend) == (25, 28, 28, backend)
    records = read_records(out, backend)
    assert [k for k, _ in records] == [b"%08d" % i for i in range(25)]
    for i, (_, value) in enumerate(records):
        datum = Datum.FromString(value)
        assert (datum.channels, datum.height, datum.width) == (1, 28, 28)
        assert datum.data == images[i].tobytes()
        assert datum.label == labels[i]
        assert datum.HasField("label")
        assert len(value) == 795
    assert leftovers(tmp_path) == []


def test_lmdb_layout_and_transactions(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(2500, 4, 3)
    out = tmp_path / "db"
    convert(ipath, lpath, out, batch_size=1000)
    assert sorted(os.listdir(out)) == ["data.mdb", "lock.mdb", "mnist2db.json"]
    env = lmdb.open(str(out), readonly=True, lock=False)
    # One write transaction per batch: 1000 + 1000 + 500 records.
    assert env.info()["last_txnid"] == 3
    assert env.stat()["entries"] == 2500
    env.close()
    convert(ipath, lpath, tmp_path / "db7", batch_size=7)
    env = lmdb.open(str(tmp_path / "db7"), readonly=True, lock=False)
    assert env.info()["last_txnid"] == 358  # ceil(2500 / 7)
    env.close()


def test_non_square_and_labels_over_127(tmp_path: Path) -> None:

    images = np.arange(3 * 5 * 2, dtype=np.uint8).reshape(3, 5, 2)
    labels = np.array([0, 127, 255], dtype=np.uint8)
    ipath = write_idx(tmp_path / "i", images)
    lpath = write_idx(tmp_path / "l", labels)
    convert(ipath, lpath, tmp_path / "db", backend="leveldb")
    got = [(k, d.height, d.width, d.label, d.data) for k, d in iter_db(tmp_path / "db")]
    assert got == [
        (b"00000000", 5, 2, 0, images[0].tobytes()),
        (b"00000001", 5, 2, 127, images[1].tobytes()),
        (b"00000002", 5, 2, 255, images[2].tobytes()),
    ]


def test_empty_dataset(tmp_path: Path) -> None:

    ipath = write_idx(tmp_path / "i", np.zeros((0, 28, 28), np.uint8))
    lpath = write_idx(tmp_path / "l", np.zeros((0,), np.uint8))
    result = convert(ipath, lpath, tmp_path / "db")
    assert result.count == 0
    assert list(iter_db(tmp_path / "db")) == []


def test_existing_output_is_refused_and_untouched(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="already exists"):
        convert(ipath, lpath, out)
    with pytest.raises(
        OutputExistsError,
        match=r"holds 'precious.txt' \(a file\), which is not part of an LMDB database; refusing",
    ):
        convert(ipath, lpath, out, overwrite=True)
    assert (out / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["db", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    )


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_overwrite_replaces_a_database(mnist_pair, tmp_path: Path, backend: str) -> None:
    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    convert(ipath, lpath, out, backend=backend)
    ipath2, lpath2, images2, _ = mnist_pair(8, stem="other", seed=5)
    convert(ipath2, lpath2, out, backend=backend, overwrite=True)
    records = list(iter_db(out))
    assert len(records) == 8
    assert records[7][1].data == images2[7].tobytes()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_overwrite_never_replaces_the_other_backend(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    other = "leveldb" if backend == "lmdb" else "lmdb"
    convert(ipath, lpath, out, backend=other)
    before = sorted(p.name for p in out.iterdir())
    name = {"lmdb": "an LMDB", "leveldb": "a LevelDB"}
    with pytest.raises(OutputExistsError) as info:
        convert(ipath, lpath, out, backend=backend, overwrite=True)
    assert str(info.value) == (
        f"{out}: it is {name[other]} database (use --backend {other}, or remove it); "
        f"--overwrite replaces only {name[backend]} database"
    )
    assert sorted(p.name for p in out.iterdir()) == before
    assert len(list(iter_db(out))) == 5


def test_bad_input_leaves_nothing(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(5)
    with open(ipath, "ab") as f:
        f.write(b"x")
    with pytest.raises(IdxFormatError, match="trailing bytes"):
        convert(ipath, lpath, tmp_path / "db")
    assert not (tmp_path / "db").exists()
    assert leftovers(tmp_path) == []


def test_failure_mid_write_leaves_nothing(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(50)

    def explode(done: int, total: int) -> None:
        if done >= 20:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        convert(ipath, lpath, tmp_path / "db", batch_size=10, progress=explode)
    assert not (tmp_path / "db").exists()
    assert leftovers(tmp_path) == []


def test_progress_reports_batches(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(25)
    seen: list[tuple[int, int]] = []
    convert(ipath, lpath, tmp_path / "db", batch_size=10, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(10, 25), (20, 25), (25, 25)]


def test_parent_directories_are_created(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    convert(ipath, lpath, tmp_path / "a" / "b" / "db")
    assert len(list(iter_db(tmp_path / "a" / "b" / "db"))) == 3


def test_parent_is_a_file(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="is not a directory"):
        convert(ipath, lpath, tmp_path / "file" / "db")


def test_unknown_backend(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    with pytest.raises(
        BackendError, match="unknown backend 'rocksdb': expected one of lmdb, leveldb"
    ):
        convert(ipath, lpath, tmp_path / "db", backend="rocksdb")


# -- --overwrite replaces only what mnist2db would have written ----------------------------


@pytest.mark.parametrize(
    ("marker", "backend"), [("CURRENT", "leveldb"), ("data.mdb", "lmdb"), ("CURRENT", "lmdb")]
)
def test_overwrite_keeps_a_directory_that_only_looks_like_a_database(
    mnist_pair, tmp_path: Path, marker: str, backend: str
) -> None:
    """An empty CURRENT (or data.mdb) beside a user's file is not a database."""
    ipath, lpath, *_ = mnist_pair(5)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / marker).touch()
    (proj / "thesis.tex").write_text("important")
    with pytest.raises(OutputExistsError, match="refusing to replace it"):
        convert(ipath, lpath, proj, backend=backend, overwrite=True)
    assert (proj / "thesis.tex").read_text() == "important"
    assert sorted(p.name for p in proj.iterdir()) == sorted([marker, "thesis.tex"])
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_overwrite_names_a_directory_holding_only_the_metadata(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    """Only mnist2db.json left (the database files deleted): say so, not an ENOENT."""
    ipath, lpath, *_ = mnist_pair(5)
    husk = tmp_path / "husk"
    husk.mkdir()
    (husk / "mnist2db.json").write_text("{}")
    name = {"lmdb": "an LMDB", "leveldb": "a LevelDB"}[backend]
    with pytest.raises(OutputExistsError) as info:
        convert(ipath, lpath, husk, backend=backend, overwrite=True)
    assert str(info.value) == (
        f"{husk}: holds only mnist2db.json, not {name} database (its files are missing); "
        "refusing to replace it (remove it, or choose another name)"
    )
    assert [p.name for p in husk.iterdir()] == ["mnist2db.json"]
    assert (husk / "mnist2db.json").read_text() == "{}"


def test_overwrite_names_a_leveldb_database_another_process_holds(
    mnist_pair, tmp_path: Path
) -> None:
    """Busy, not foreign: "does not open as a LevelDB database" would send the user astray."""
    import subprocess
    import sys

    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    convert(ipath, lpath, out, backend="leveldb")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import plyvel, sys; db = plyvel.DB(sys.argv[1]); print('held', flush=True); "
            "sys.stdin.read()",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(OutputExistsError) as info:
            convert(ipath, lpath, out, backend="leveldb", overwrite=True)
        assert str(info.value) == (
            f"{out}: is a LevelDB database another process has open (IO error: lock "
            f"{out}/LOCK: Resource temporarily unavailable); refusing to replace it while "
            "it is in use"
        )
    finally:
        holder.communicate("")
    assert len(list(iter_db(out))) == 5


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_overwrite_keeps_a_database_files_only_lookalike(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    """Every entry has a database file's name, but it does not open as one: refused."""
    ipath, lpath, *_ = mnist_pair(5)
    fake = tmp_path / "fake"
    fake.mkdir()
    names = ["data.mdb"] if backend == "lmdb" else ["CURRENT", "000001.log"]
    for name in names:
        (fake / name).write_text("my notes, not a database")
    name = {"lmdb": "an LMDB", "leveldb": "a LevelDB"}[backend]
    with pytest.raises(OutputExistsError, match=f"does not open as {name} database"):
        convert(ipath, lpath, fake, backend=backend, overwrite=True)
    for name in names:
        assert (fake / name).read_text() == "my notes, not a database"


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize("extra", ["notes.txt", "subdir", "link"])
def test_overwrite_keeps_a_database_holding_other_things(
    mnist_pair, tmp_path: Path, backend: str, extra: str
) -> None:
    """A real database that also holds a user's file, folder or link is kept whole."""
    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    convert(ipath, lpath, out, backend=backend)
    if extra == "subdir":
        (out / extra).mkdir()
        (out / extra / "inside.txt").write_text("mine")
    elif extra == "link":
        (out / extra).symlink_to(ipath)
    else:
        (out / extra).write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    kind = {"notes.txt": "a file", "subdir": "a directory", "link": "a symbolic link"}[extra]
    with pytest.raises(OutputExistsError, match=f"holds '{extra}' \\({kind}\\)"):
        convert(ipath, lpath, out, backend=backend, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert len(list(iter_db(out))) == 5
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize("how", ["inside", "same-name", "hard-link", "equal"])
def test_an_input_inside_the_destination_is_refused_before_any_work(
    tmp_path: Path, backend: str, how: str
) -> None:
    """`convert db/images db/labels db --overwrite` never deletes its own inputs."""

    out = tmp_path / "db"
    images = make_images(4)
    labels = make_labels(4)
    ipath = write_idx(tmp_path / "i", images)
    lpath = write_idx(tmp_path / "l", labels)
    convert(ipath, lpath, out, backend=backend)
    if how == "inside":
        (out / "i").write_bytes(ipath.read_bytes())
        ipath = out / "i"
    elif how == "same-name":  # an input named as the backend's own files
        name = "lock.mdb" if backend == "lmdb" else "000009.log"
        (out / name).write_bytes(lpath.read_bytes())
        lpath = out / name
    elif how == "hard-link":
        os.link(out / ("data.mdb" if backend == "lmdb" else "CURRENT"), tmp_path / "hl")
        lpath = tmp_path / "hl"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    target = out if how != "equal" else ipath
    with pytest.raises((OutputExistsError, IdxFormatError)) as info:
        convert(ipath, lpath, target, backend=backend, overwrite=True)
    if how != "hard-link":  # a hard-linked database file is not an IDX file either way
        assert str(info.value).startswith(f"{target}: holds the input ")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert ipath.exists() and lpath.exists()


def test_input_inside_is_refused_even_when_valid(tmp_path: Path) -> None:

    out = tmp_path / "db"
    convert(
        write_idx(tmp_path / "i", make_images(3)), write_idx(tmp_path / "l", make_labels(3)), out
    )
    ipath = write_idx(out / "data.mdb.images", make_images(3))
    os.replace(ipath, out / "lock.mdb")  # a valid IDX file under one of LMDB's names
    lpath = write_idx(tmp_path / "l2", make_labels(3))
    with pytest.raises(OutputExistsError) as info:
        convert(out / "lock.mdb", lpath, out, overwrite=True)
    assert str(info.value) == (
        f"{out}: holds the input {out / 'lock.mdb'}; refusing to replace it "
        "(write the database somewhere else)"
    )
    assert (out / "lock.mdb").read_bytes()[:4] == b"\0\0\x08\x03"


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_a_failed_run_removes_the_directories_it_created(
    mnist_pair, tmp_path: Path, backend: str
) -> None:
    """A failed `convert ... a/b/c/out` leaves no a/ (and an existing a/ is kept)."""
    ipath, lpath, *_ = mnist_pair(30)

    def explode(done: int, total: int) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        convert(ipath, lpath, tmp_path / "a" / "b" / "c" / "out", backend=backend,
                batch_size=10, progress=explode)  # fmt: skip
    assert not (tmp_path / "a").exists()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine").write_text("x")
    with pytest.raises(RuntimeError):
        convert(ipath, lpath, tmp_path / "a" / "b" / "out", backend=backend,
                batch_size=10, progress=explode)  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["mine"]


def test_empty_destination_is_refused(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    with pytest.raises(Exception, match="the destination path is empty"):
        convert(ipath, lpath, "")


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_non_utf8_destination_works(mnist_pair, tmp_path: Path, backend: str) -> None:
    """Item 6 (writers): a database path that is not valid UTF-8."""
    ipath, lpath, images, _ = mnist_pair(6)
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xe9_db")
    result = convert(ipath, lpath, out, backend=backend)
    assert result.count == 6
    assert os.path.isdir(os.fsencode(out))
    convert(ipath, lpath, out, backend=backend, overwrite=True)
    env_path = Path(out)
    assert [bytes(k) for k, _ in read_records(env_path, backend)] == [b"%08d" % i for i in range(6)]
    assert leftovers(tmp_path) == []


def test_leveldb_overwrite_keeps_a_users_log_file(mnist_pair, tmp_path: Path) -> None:
    """LevelDB's own logs are numbered (000003.log): a user's training.log is not one."""
    ipath, lpath, *_ = mnist_pair(5)
    out = tmp_path / "db"
    convert(ipath, lpath, out, backend="leveldb")
    (out / "training.log").write_text("epoch 1: loss 0.3")
    with pytest.raises(OutputExistsError, match="holds 'training.log' \\(a file\\)"):
        convert(ipath, lpath, out, backend="leveldb", overwrite=True)
    assert (out / "training.log").read_text() == "epoch 1: loss 0.3"


# -- whole conversions --------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 7, 1000, 5000])
def test_batch_sizes_give_the_same_records(mnist_pair, tmp_path: Path, batch_size: int) -> None:
    ipath, lpath, images, labels = mnist_pair(2003, 5, 4)
    convert(ipath, lpath, tmp_path / "db", batch_size=batch_size)
    with open_reader(tmp_path / "db") as reader:
        records = [(bytes(k), bytes(v)) for k, v in reader]
    assert records == [
        (b"%08d" % i, serialize(images[i].tobytes(), 5, 4, int(labels[i]))) for i in range(2003)
    ]


def test_on_start_sees_both_headers_once_the_checks_pass_and_may_stop_the_work(
    tmp_path: Path,
) -> None:
    images = write_idx(tmp_path / "i", make_images(3, 2, 4))
    labels = write_idx(tmp_path / "l", make_labels(3))
    seen: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []

    def started(image_header, label_header) -> None:  # type: ignore[no-untyped-def]
        seen.append((image_header.dims, label_header.dims, (tmp_path / "db").exists()))

    convert(images, labels, tmp_path / "db", on_start=started)
    assert seen == [((3, 2, 4), (3,), False)]
    # a refusal there leaves nothing behind; a refused destination never reaches it
    with pytest.raises(IdxFormatError, match="stop"):
        convert(images, labels, tmp_path / "b", on_start=lambda *_: _stop())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "i", "l"]
    with pytest.raises(OutputExistsError):
        convert(images, labels, tmp_path / "db", on_start=started)
    assert len(seen) == 1


def _stop() -> None:
    raise IdxFormatError("stop")
