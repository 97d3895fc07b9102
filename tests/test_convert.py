"""convert(): real LMDB and LevelDB databases read back and decoded; output safety."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np
import plyvel
import pytest

from mnist2db import BackendError, IdxFormatError, OutputExistsError, convert, iter_db
from mnist2db.backends import open_writer
from mnist2db.datum_pb2 import Datum


def read_records(path: Path, backend: str) -> list[tuple[bytes, bytes]]:
    if backend == "lmdb":
        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            records = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        env.close()
        return records
    db = plyvel.DB(str(path), create_if_missing=False)
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
    assert sorted(os.listdir(out)) == ["data.mdb", "lock.mdb"]
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
    from conftest import write_idx

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
    from conftest import write_idx

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
    name = {"lmdb": "an LMDB", "leveldb": "a LevelDB"}[backend]
    first = {"lmdb": "000003.log", "leveldb": "data.mdb"}[backend]  # first in name order
    with pytest.raises(OutputExistsError) as info:
        convert(ipath, lpath, out, backend=backend, overwrite=True)
    assert str(info.value) == (
        f"{out}: holds '{first}' (a file), which is not part of {name} database; "
        f"refusing to replace it (--overwrite replaces only {name} database)"
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


def test_lmdb_map_grows_when_full(tmp_path: Path) -> None:
    writer = open_writer("lmdb", str(tmp_path), size_hint=0)
    start = writer.map_size  # type: ignore[attr-defined]
    value = b"v" * 3000
    for batch in range(30):
        writer.write_batch([(b"%08d" % (batch * 1000 + i), value) for i in range(1000)])
    writer.close()
    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    assert env.stat()["entries"] == 30000
    assert env.info()["map_size"] > start
    env.close()
