"""open_db: the read-only, map-style dataset over a finished database, on both backends."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from pathlib import Path

import lmdb
import numpy as np
import plyvel
import pytest
from db_helpers import write_raw_db

import mnist2db
from mnist2db import BackendError, Mnist2dbError, convert, open_db
from mnist2db.errors import MissingKeyError, RecordIndexError


@pytest.fixture(params=["lmdb", "leveldb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_db(
    mnist_pair, tmp_path: Path, backend: str, count: int = 25, rows: int = 6, cols: int = 5
):
    ipath, lpath, images, labels = mnist_pair(count, rows, cols)
    out = tmp_path / f"db_{backend}"
    convert(ipath, lpath, out, backend=backend)
    return out, images, labels


def test_len_index_negative_index(mnist_pair, tmp_path: Path, backend: str) -> None:
    path, images, labels = make_db(mnist_pair, tmp_path, backend)
    with open_db(path) as db:
        assert db.backend == backend
        assert len(db) == 25
        image, label = db[7]
        assert image.dtype == np.uint8
        assert image.shape == (1, 6, 5)
        assert np.array_equal(image[0], images[7])
        assert type(label) is int
        assert label == int(labels[7])
        last_image, last_label = db[-1]
        assert np.array_equal(last_image[0], images[24])
        assert last_label == int(labels[24])
        assert np.array_equal(db[-25][0][0], images[0])
        assert np.array_equal(db[np.int64(3)][0][0], images[3])
        assert db.key(7) == b"00000007"


def test_slicing_and_iteration(mnist_pair, tmp_path: Path, backend: str) -> None:
    path, images, labels = make_db(mnist_pair, tmp_path, backend)
    db = open_db(path)
    part = db[3:9:2]
    assert [label for _, label in part] == [int(labels[i]) for i in (3, 5, 7)]
    assert all(
        np.array_equal(img[0], images[i]) for (img, _), i in zip(part, (3, 5, 7), strict=True)
    )
    assert [label for _, label in db[-3:]] == [int(x) for x in labels[-3:]]
    assert db[30:40] == []
    everything = list(db)
    assert len(everything) == 25
    assert np.array_equal(np.stack([img[0] for img, _ in everything]), images)
    assert [label for _, label in everything] == [int(x) for x in labels]
    records = list(db.records(20, 100))
    assert [(i, k) for i, k, _, _ in records] == [(i, b"%08d" % i) for i in range(20, 25)]
    db.close()


@pytest.mark.parametrize("index", [25, -26, 1000])
def test_index_out_of_range(mnist_pair, tmp_path: Path, backend: str, index: int) -> None:
    path, _, _ = make_db(mnist_pair, tmp_path, backend)
    db = open_db(path)
    with pytest.raises(IndexError) as info:
        db[index]
    assert isinstance(info.value, RecordIndexError)
    assert isinstance(info.value, Mnist2dbError)
    assert str(info.value) == f"{path}: index {index} is out of range (25 records)"


def test_missing_key(mnist_pair, tmp_path: Path, backend: str) -> None:
    path, _, labels = make_db(mnist_pair, tmp_path, backend)
    db = open_db(path)
    assert db.get("00000004")[1] == int(labels[4])
    with pytest.raises(KeyError) as info:
        db.get(b"00000099")
    assert isinstance(info.value, MissingKeyError)
    assert str(info.value) == f"{path}: no record with key 00000099"


def test_images_are_writable_copies(mnist_pair, tmp_path: Path) -> None:
    # DataLoader's default collate warns on read-only arrays (torch.as_tensor).
    path, images, _ = make_db(mnist_pair, tmp_path, "lmdb")
    db = open_db(path)
    image, _ = db[0]
    assert image.flags.writeable
    image[:] = 0
    assert np.array_equal(db[0][0][0], images[0])


def test_map_style_dataset_protocol(mnist_pair, tmp_path: Path, backend: str) -> None:
    """What torch.utils.data.DataLoader uses: len(), __getitem__(int), pickling to workers,
    and a default-collate-able item (ndarray, int) — checked without importing torch."""
    path, images, labels = make_db(mnist_pair, tmp_path, backend)
    db = open_db(path)
    assert hasattr(db, "__getitem__") and hasattr(db, "__len__")
    batch_indices = [4, 0, 19]
    batch = [db[i] for i in batch_indices]
    stacked = np.stack([img for img, _ in batch])
    assert stacked.shape == (3, 1, 6, 5)
    db[0]  # a handle is open: pickling must not carry it
    clone = pickle.loads(pickle.dumps(db))
    assert len(clone) == 25
    assert clone[19][1] == int(labels[19])
    assert np.array_equal(clone[4][0][0], images[4])
    clone.close()


def _labels_in_child(args: tuple[object, list[int]]) -> list[int]:
    db, indices = args
    return [db[i][1] for i in indices]  # type: ignore[index]


def test_forked_workers_read(mnist_pair, tmp_path: Path, backend: str) -> None:
    """LMDB: forked children reopen the environment and read. LevelDB admits one process at
    a time: every child fails with the one BackendError that says what to do."""
    path, _, labels = make_db(mnist_pair, tmp_path, backend)
    db = open_db(path)
    assert db[0][1] == int(labels[0])  # the parent has the database open before forking
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        if backend == "lmdb":
            got = pool.map(_labels_in_child, [(db, [1, 2, 3]), (db, [20, 21])])
            assert got == [[int(labels[i]) for i in (1, 2, 3)], [int(labels[i]) for i in (20, 21)]]
        else:
            with pytest.raises(BackendError) as info:
                pool.map(_labels_in_child, [(db, [1, 2, 3]), (db, [20, 21])])
            assert str(info.value) == (
                f"{path}: this LevelDB database was opened by process {os.getpid()} before "
                "it forked this one; LevelDB admits one process at a time: read it with "
                "num_workers=0 (in the process that opened it), or convert it to LMDB "
                "(mnist2db convert --backend lmdb), which any number of processes can read"
            )
    # The parent's handle still works after the children exit, and a second dataset on
    # the same database shares it (neither backend can be opened twice by one process).
    assert [db[i][1] for i in (5, 6)] == [int(labels[5]), int(labels[6])]
    again = open_db(path)
    assert again[6][1] == int(labels[6])
    again.close()
    assert db[7][1] == int(labels[7])


def test_keys_not_in_caffe_sequence(tmp_path: Path) -> None:
    """A database with other keys is indexed in key order (the keys are read once)."""
    path = tmp_path / "custom_lmdb"
    values = {
        b"b": mnist2db.array_to_datum(np.full((1, 2, 2), 2, np.uint8), 2).SerializeToString(),
        b"a": mnist2db.array_to_datum(np.full((1, 2, 2), 1, np.uint8), 1).SerializeToString(),
        b"c": mnist2db.array_to_datum(np.full((1, 2, 2), 3, np.uint8), 3).SerializeToString(),
    }
    env = lmdb.open(str(path), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()
    db = open_db(path)
    assert len(db) == 3
    assert [db.key(i) for i in range(3)] == [b"a", b"b", b"c"]
    assert [label for _, label in db] == [1, 2, 3]
    assert db[-1][1] == 3
    assert int(db[1][0].sum()) == 8


def test_float_datum(tmp_path: Path) -> None:
    path = tmp_path / "float_lmdb"
    array = np.arange(6, dtype=np.float32).reshape(1, 2, 3) / 2
    env = lmdb.open(str(path), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"00000000", mnist2db.array_to_datum(array, 4).SerializeToString())
    env.close()
    image, label = open_db(path)[0]
    assert label == 4
    assert image.dtype == np.float64
    assert np.array_equal(image, array)


def test_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(BackendError) as info:
        open_db(tmp_path / "plain")
    assert str(info.value) == (
        f"{tmp_path / 'plain'}: neither an LMDB (no data.mdb) nor a LevelDB (no CURRENT) database"
    )
    with pytest.raises(BackendError, match="no such database"):
        open_db(tmp_path / "missing")


def test_leveldb_held_by_another_process_names_the_limit(mnist_pair, tmp_path: Path) -> None:
    import subprocess
    import sys

    path, _, _ = make_db(mnist_pair, tmp_path, "leveldb")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import plyvel, sys; db = plyvel.DB(sys.argv[1]); print('held', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(BackendError) as info:
            open_db(path)
        assert str(info.value) == (
            f"{path}: cannot open LevelDB database: IO error: lock {path}/LOCK: Resource "
            "temporarily unavailable (another process has it open; LevelDB admits one "
            "process at a time: read it with "
            "num_workers=0 (in the process that opened it), or convert it to LMDB (mnist2db "
            "convert --backend lmdb), which any number of processes can read)"
        )
    finally:
        holder.communicate("")


def test_leveldb_held_in_this_process_outside_mnist2db_has_no_process_hint(
    mnist_pair, tmp_path: Path
) -> None:
    """A lock this process holds (a plyvel handle of the user's): LevelDB's text, no
    b'...' repr, and no "one process at a time" hint (it is this process)."""
    path, _, _ = make_db(mnist_pair, tmp_path, "leveldb")
    holder = plyvel.DB(str(path))
    try:
        with pytest.raises(BackendError) as info:
            open_db(path)
        assert str(info.value) == (
            f"{path}: cannot open LevelDB database: IO error: lock {path}/LOCK: "
            "already held by process"
        )
    finally:
        holder.close()


def test_array_datum_helpers_round_trip() -> None:
    array = np.arange(12, dtype=np.uint8).reshape(1, 3, 4)
    datum = mnist2db.array_to_datum(array, 9)
    assert (datum.channels, datum.height, datum.width, datum.label) == (1, 3, 4, 9)
    assert np.array_equal(mnist2db.datum_to_array(datum), array)


def test_lmdb_whose_lock_file_cannot_be_opened(mnist_pair, tmp_path: Path) -> None:
    """As on read-only media: lock.mdb cannot be opened for writing, so LMDB is read
    unlocked. Root ignores chmod, so the lock file is made unopenable by being a directory."""
    path, images, _ = make_db(mnist_pair, tmp_path, "lmdb")
    (path / "lock.mdb").unlink()
    (path / "lock.mdb").mkdir()
    with open_db(path) as db:
        assert len(db) == 25
        assert np.array_equal(db[-1][0][0], images[-1])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod; see the test above")
def test_lmdb_in_a_read_only_folder(mnist_pair, tmp_path: Path) -> None:
    path, images, _ = make_db(mnist_pair, tmp_path, "lmdb")
    (path / "lock.mdb").unlink()
    path.chmod(0o555)
    (path / "data.mdb").chmod(0o444)
    try:
        with open_db(path) as db:
            assert np.array_equal(db[3][0][0], images[3])
    finally:
        path.chmod(0o755)


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_keys_that_only_look_like_caffe_keys_are_indexed_in_key_order(
    tmp_path: Path, backend: str
) -> None:
    """Same count, first and last key as Caffe's sequence, but 00000002 replaced by
    00000003x: indexing must agree with iteration (key order) and never fail."""
    keys = [b"00000000", b"00000001", b"00000003", b"00000003x", b"00000004"]
    values = [mnist2db.encode_datum(bytes([i]) * 4, 1, 2, 2, i) for i in range(5)]
    path = write_raw_db(tmp_path / "db", backend, dict(zip(keys, values, strict=True)))
    with open_db(path) as dataset:
        # Backwards: an index must not depend on which records were read before.
        by_index = [dataset[i][1] for i in reversed(range(len(dataset)))][::-1]
        by_iteration = [label for _, label in dataset]
        assert dataset.key(3) == b"00000003x"
    assert by_index == by_iteration == [0, 1, 2, 3, 4]


def test_non_integer_indices_raise_type_error(mnist_pair, tmp_path: Path) -> None:
    path, _, _ = make_db(mnist_pair, tmp_path, "lmdb")
    with open_db(path) as db:
        for index in (1.0, "3", None):
            with pytest.raises(TypeError, match="record indices must be integers or slices"):
                db[index]  # type: ignore[index]


def test_non_utf8_database_path(mnist_pair, tmp_path: Path, backend: str) -> None:
    """A database whose name is not valid UTF-8: py-lmdb and plyvel get os.fsencode(path)."""
    path, images, labels = make_db(mnist_pair, tmp_path, backend)
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xe9_db")
    os.rename(path, odd)
    with open_db(odd) as db:
        assert len(db) == 25 and db[3][1] == int(labels[3])
        assert np.array_equal(db[4][0][0], images[4])
    assert sum(1 for _ in mnist2db.iter_db(odd)) == 25
    with mnist2db.open_reader(odd) as reader:
        assert reader.first_key() == b"00000000"
