"""DataLoader's worker patterns, with real processes and threads: the parent opens the
database and reads first, then 4 workers each read every one of 10 000 records (each in its
own random order, one by one and in batches) and every record is compared with the source.

LMDB reads correctly under fork, spawn and forkserver. LevelDB admits one process at a
time: while the parent holds it, every worker fails with the same one-line BackendError
that says what to do. A real torch DataLoader runs when torch is importable.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading

import numpy as np
import pytest

from mnist2db import Mnist2dbError, convert, open_db

RECORDS = 10_000
WORKERS = 4
HINT = (
    "LevelDB admits one process at a time: read it with num_workers=0 (in the process that "
    "opened it), or convert it to LMDB (mnist2db convert --backend lmdb), which any number "
    "of processes can read"
)


def digest(order: np.ndarray, images: np.ndarray, labels: np.ndarray) -> str:
    hasher = hashlib.sha256()
    for i in order:
        hasher.update(images[i].tobytes() + bytes([int(labels[i])]))
    return hasher.hexdigest()


def read_everything(args: tuple[object, int]) -> tuple[str, str, int]:
    """In a worker: read every record by db[i] in a random order, then by __getitems__ in
    batches of 256; return the two digests, or the error's type and text."""
    db, seed = args
    try:
        order = np.random.default_rng(seed).permutation(len(db))  # type: ignore[arg-type]
        one = hashlib.sha256()
        for i in order:
            image, label = db[int(i)]  # type: ignore[index]
            one.update(image.tobytes() + bytes([label]))
        batched = hashlib.sha256()
        for start in range(0, len(order), 256):
            for image, label in db.__getitems__(order[start : start + 256].tolist()):  # type: ignore[attr-defined]
                batched.update(image.tobytes() + bytes([label]))
        return one.hexdigest(), batched.hexdigest(), os.getpid()
    except Exception as exc:  # reported to the parent with its class
        return (
            f"{type(exc).__name__}{'(Mnist2dbError)' if isinstance(exc, Mnist2dbError) else ''}",
            str(exc),
            os.getpid(),
        )


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory):
    from helpers import make_images, make_labels, write_idx

    root = tmp_path_factory.mktemp("workers")
    images = make_images(RECORDS, 6, 5)
    labels = make_labels(RECORDS)
    labels[::7] = 200  # labels >= 128 take protobuf's path: both paths are compared
    ipath = write_idx(root / "images-idx3-ubyte", images)
    lpath = write_idx(root / "labels-idx1-ubyte", labels)
    paths = {}
    for backend in ("lmdb", "leveldb"):
        paths[backend] = root / f"db_{backend}"
        convert(ipath, lpath, paths[backend], backend=backend)
    return paths, images, labels


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_workers_read_every_record(databases, backend: str, method: str) -> None:
    paths, images, labels = databases
    path = paths[backend]
    db = open_db(path)
    # The parent reads first, as a training script does (len, a look at a record).
    assert len(db) == RECORDS
    assert np.array_equal(db[0][0][0], images[0]) and db[7][1] == 200
    context = multiprocessing.get_context(method)
    with context.Pool(WORKERS) as pool:
        results = pool.map_async(read_everything, [(db, seed) for seed in range(WORKERS)]).get(
            timeout=300
        )
    assert len({pid for _, _, pid in results}) >= 1
    if backend == "lmdb":
        for seed, (one, batched, _) in enumerate(results):
            expected = digest(np.random.default_rng(seed).permutation(RECORDS), images, labels)
            assert one == expected and batched == expected
    else:
        if method == "fork":
            message = (
                f"{path}: this LevelDB database was opened by process {os.getpid()} before it "
                f"forked this one; {HINT}"
            )
        else:
            message = (
                f"{path}: cannot open LevelDB database: IO error: lock {path}/LOCK: Resource "
                f"temporarily unavailable (another process has it open; {HINT})"
            )
        assert [(kind, text) for kind, text, _ in results] == [
            ("BackendError(Mnist2dbError)", message)
        ] * WORKERS
    # The parent's own reads still work after the workers.
    assert db[RECORDS - 1][1] == int(labels[RECORDS - 1])
    assert np.array_equal(db[1234][0][0], images[1234])
    db.close()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_threads_share_one_handle(databases, backend: str) -> None:
    """8 threads open the same database at once and read all of it; iter_db works while a
    dataset is open (one handle per process, guarded by a lock)."""
    import mnist2db

    paths, images, labels = databases
    path = paths[backend]
    held = open_db(path)
    errors: list[BaseException] = []
    digests: list[str] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        try:
            barrier.wait()
            with open_db(path) as db:
                digests.append(read_everything((db, seed))[0] + f":{seed}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []
    for entry in digests:
        value, seed = entry.split(":")
        assert value == digest(
            np.random.default_rng(int(seed)).permutation(RECORDS), images, labels
        )
    assert len(digests) == 8
    count = 0
    for key, datum in mnist2db.iter_db(path):
        assert key == b"%08d" % count and datum.label == labels[count]
        count += 1
    assert count == RECORDS
    assert held[5][1] == int(labels[5])
    held.close()


def test_read_range_and_getitems_shapes(databases) -> None:
    paths, images, labels = databases
    with open_db(paths["lmdb"]) as db:
        block, block_labels = db.read_range(100, 356)
        assert block.shape == (256, 1, 6, 5) and block.dtype == np.uint8
        assert np.array_equal(block[:, 0], images[100:356])
        assert block_labels.tolist() == labels[100:356].tolist()
        assert block.flags.writeable


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_torch_dataloader(databases, method: str) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths, images, labels = databases
    db = open_db(paths["lmdb"])
    assert db[0][1] == int(labels[0])
    loader = DataLoader(
        db, batch_size=256, num_workers=2, multiprocessing_context=method, shuffle=False
    )
    seen = 0
    for batch_images, batch_labels in loader:
        n = len(batch_labels)
        assert batch_images.dtype == torch.uint8 and batch_images.shape[1:] == (1, 6, 5)
        assert np.array_equal(batch_images.numpy()[:, 0], images[seen : seen + n])
        assert batch_labels.tolist() == labels[seen : seen + n].tolist()
        seen += n
    assert seen == RECORDS
    db.close()
