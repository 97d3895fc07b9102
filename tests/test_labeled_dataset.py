"""open_db(images, labels=...): (image, targets) read by every path of the reader (db[i],
slices, __getitems__, read_range, iteration), in worker processes (fork, spawn,
forkserver) and threads; a label database that is not the pair refused in one line."""

from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import threading

import numpy as np
import pytest
from db_helpers import write_labels

from mnist2db import convert, open_db
from mnist2db.errors import DatumError, MissingKeyError
from mnist2db.formats.datum.message import record_keys
from mnist2db.reading.labeled_dataset import LabeledDataset

RECORDS = 3000
WIDTH = 5


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    from helpers import make_images, make_labels, write_idx

    root = tmp_path_factory.mktemp("labeled")
    images = make_images(RECORDS, 6, 5)
    labels = make_labels(RECORDS)
    ipath = write_idx(root / "images-idx3-ubyte", images)
    lpath = write_idx(root / "labels-idx1-ubyte", labels)
    targets = np.random.default_rng(28).normal(size=(RECORDS, WIDTH)).astype(np.float32)
    paths = {}
    for backend in ("lmdb", "leveldb"):
        paths[backend] = (root / f"db_{backend}", root / f"db_{backend}_labels")
        convert(ipath, lpath, paths[backend][0], backend=backend)
        write_labels(paths[backend][1], targets, backend)
    return paths, images, targets, root


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_read_path(pair, backend: str) -> None:
    paths, images, targets, _ = pair
    with open_db(paths[backend][0], labels=paths[backend][1]) as db:
        assert isinstance(db, LabeledDataset) and len(db) == RECORDS and db.width == WIDTH
        image, row = db[17]
        assert np.array_equal(image[0], images[17])
        assert row.dtype == np.float32 and row.tobytes() == targets[17].tobytes()
        row[0] = 99  # a fresh array each time
        assert db[17][1].tobytes() == targets[17].tobytes()
        assert db[-1][1].tobytes() == targets[-1].tobytes()
        assert [r.tobytes() for _, r in db[5:9]] == [t.tobytes() for t in targets[5:9]]
        batch = db.__getitems__([3, 2999, 0, -2])
        assert [r.tobytes() for _, r in batch] == [targets[i].tobytes() for i in (3, 2999, 0, -2)]
        assert np.array_equal(np.stack([i for i, _ in batch])[:, 0], images[[3, 2999, 0, -2]])
        stacked, rows = db.read_range(100, 110)
        assert stacked.shape == (10, 1, 6, 5) and rows.dtype == np.float32
        assert rows.tobytes() == targets[100:110].tobytes()
        assert db.read_range(5, 5)[1].shape == (0, WIDTH)
        everything = list(db)
        assert len(everything) == RECORDS
        assert np.stack([r for _, r in everything]).tobytes() == targets.tobytes()


def read_all(args: tuple[LabeledDataset, int]) -> tuple[str, str]:
    db, seed = args
    order = np.random.default_rng(seed).permutation(len(db))
    one = hashlib.sha256()
    for i in order:
        image, row = db[int(i)]
        one.update(image.tobytes() + row.tobytes())
    batched = hashlib.sha256()
    for start in range(0, len(order), 256):
        for image, row in db.__getitems__(order[start : start + 256].tolist()):
            batched.update(image.tobytes() + row.tobytes())
    return one.hexdigest(), batched.hexdigest()


def expected(seed: int, images: np.ndarray, targets: np.ndarray) -> str:
    digest = hashlib.sha256()
    for i in np.random.default_rng(seed).permutation(RECORDS):
        digest.update(images[i].tobytes() + targets[i].tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers(pair, method: str) -> None:
    paths, images, targets, _ = pair
    db = open_db(paths["lmdb"][0], labels=paths["lmdb"][1])
    assert db[0][1].tobytes() == targets[0].tobytes()  # the parent reads first
    with multiprocessing.get_context(method).Pool(2) as pool:
        results = pool.map_async(read_all, [(db, seed) for seed in range(2)]).get(timeout=300)
    for seed, (one, batched) in enumerate(results):
        assert one == batched == expected(seed, images, targets)
    assert pickle.loads(pickle.dumps(db))[9][1].tobytes() == targets[9].tobytes()
    db.close()


def test_threads_and_close(pair) -> None:
    paths, images, targets, _ = pair
    db = open_db(paths["lmdb"][0], labels=paths["lmdb"][1])
    results: list[str] = []

    def work(seed: int) -> None:
        results.append(read_all((db, seed))[0])
        db.close()  # another thread still reading: it reopens

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(expected(seed, images, targets) for seed in range(4))


def test_not_its_label_database(pair) -> None:
    paths, _, targets, root = pair
    images = paths["lmdb"][0]
    short = root / "short_labels"
    write_labels(short, targets[:-1])
    with pytest.raises(DatumError) as caught:
        open_db(images, labels=short)
    assert str(caught.value) == (
        f"{short}: {RECORDS - 1} label records for the {RECORDS} records of {images}: "
        "not its label database"
    )
    other = root / "other_keys"
    keys = [b"%08d_x" % i for i in range(RECORDS)]
    write_labels(other, targets, keys=keys)
    with pytest.raises(DatumError) as caught:
        open_db(images, labels=other)
    assert str(caught.value) == (
        f"{other}: key 00000000_x, where {images} holds 00000000: not its label database"
    )
    gap = root / "gap_labels"
    keys = [*record_keys(0, 10), b"00000010a", *record_keys(11, RECORDS - 11)]
    write_labels(gap, targets, keys=keys)
    db = open_db(images, labels=gap)
    assert db[9][1].tobytes() == targets[9].tobytes()
    with pytest.raises(MissingKeyError) as missing:
        db[10]
    assert str(missing.value) == f"{gap}: no label record under the image key 00000010"
    # An image database given as the labels: refused on opening, at its first record.
    with pytest.raises(DatumError) as caught:
        open_db(images, labels=paths["lmdb"][0])
    assert str(caught.value) == (
        f"{images}: key 00000000: not a label record: a Datum of float_data values "
        "(this one holds image data)"
    )
