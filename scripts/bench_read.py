"""The read side of the benchmark (issue 9): open_db against the raw py-lmdb floor.

Rows, all over the same 60 000-record LMDB (Fashion-MNIST's training set, else generated),
best of ``--repeat`` runs each, in this process:
* raw floor: one read transaction, ``txn.get(b"%08d" % i)`` + ``numpy.frombuffer`` of the
  784 pixel bytes, random order (no copy, no label), as issue 9 measured it; and the same
  loop with every name pre-bound to a local (the least Python can do);
* ``open_db`` ``db[i]`` in the same random order, sequential iteration, ``__getitems__``
  of 256 indices, ``read_range`` of 256;
* torchvision's ``FashionMNIST[i]`` (``PILToTensor``) when torchvision is importable;
* a torch ``DataLoader`` epoch (batch 256, shuffled; 0 and 2 workers) when torch is.

    python scripts/bench_read.py [--repeat 3]   (also the last table of scripts/bench.py)
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

FASHION = Path("/usr/share/datasets/fashion-mnist")


def _best(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return best, count


def read_table(images: Path, labels: Path, work: Path, repeat: int = 3) -> list[str]:
    """Convert ``images``/``labels`` to LMDB in ``work`` and time the readers; Markdown rows."""
    import lmdb

    import mnist2db

    db_path = work / "read_train_lmdb"
    mnist2db.convert(images, labels, db_path, backend="lmdb")
    db = mnist2db.open_db(db_path)
    n = len(db)
    order = np.random.default_rng(0).permutation(n).tolist()
    rows: list[tuple[str, float, int]] = []

    def raw_floor() -> int:
        # Issue 9's floor, written as one would: one read transaction, get + frombuffer.
        env = lmdb.open(str(db_path), readonly=True, lock=False, readahead=False)
        with env.begin() as txn:
            for i in order:
                np.frombuffer(txn.get(b"%08d" % i), np.uint8, 784, 9)
        env.close()
        return n

    def raw_floor_prebound() -> int:
        # The same with every name bound to a local first: the least Python can do.
        env = lmdb.open(str(db_path), readonly=True, lock=False, readahead=False)
        with env.begin() as txn:
            get, frombuffer, u8 = txn.get, np.frombuffer, np.uint8
            for i in order:
                frombuffer(get(b"%08d" % i), u8, 784, 9)
        env.close()
        return n

    def db_random() -> int:
        for i in order:
            db[i]
        return n

    def db_iterate() -> int:
        return sum(1 for _ in db)

    def db_getitems() -> int:
        for start in range(0, n, 256):
            db.__getitems__(order[start : start + 256])
        return n

    def db_read_range() -> int:
        for start in range(0, n, 256):
            db.read_range(start, start + 256)
        return n

    db.close()  # the floor opens the environment itself: py-lmdb allows one per process
    # The floors and db[i] alternate, best of each: the machine's load shifts between runs.
    timings: dict[str, list[float]] = {"floor": [], "prebound": [], "db": []}
    for _ in range(repeat):
        timings["floor"].append(_best(raw_floor, 1)[0])
        timings["prebound"].append(_best(raw_floor_prebound, 1)[0])
        db = mnist2db.open_db(db_path)
        timings["db"].append(_best(db_random, 1)[0])
        db.close()
    rows.append(("raw floor (issue 9): txn.get + numpy.frombuffer", min(timings["floor"]), n))
    rows.append(("raw floor, every name pre-bound to a local", min(timings["prebound"]), n))
    rows.append(("open_db db[i] (fresh writable array, int label)", min(timings["db"]), n))
    db = mnist2db.open_db(db_path)
    rows.append(("open_db iteration, sequential", *_best(db_iterate, repeat)))
    rows.append(("open_db __getitems__ of 256, random", *_best(db_getitems, repeat)))
    rows.append(("open_db read_range of 256, sequential", *_best(db_read_range, repeat)))
    try:
        from torchvision import datasets, transforms  # type: ignore[import-not-found]

        root = work / "tv"
        raw = root / "FashionMNIST" / "raw"
        raw.mkdir(parents=True)
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):  # fmt: skip
            source = images if "images" in name else labels
            shutil.copy(source, raw / name)  # train and "t10k" alike: only train is read
        tv = datasets.FashionMNIST(str(root), train=True, transform=transforms.PILToTensor())

        def torchvision_random() -> int:
            for i in order:
                tv[i]
            return n

        rows.append(
            ("torchvision FashionMNIST[i] (PILToTensor), random", *_best(torchvision_random, 1))
        )
    except ImportError:
        pass
    try:
        from torch.utils.data import DataLoader  # type: ignore[import-not-found]

        for workers in (0, 2):
            loader = DataLoader(db, batch_size=256, shuffle=True, num_workers=workers)

            def epoch(loader: DataLoader = loader) -> int:  # type: ignore[type-arg]
                return sum(len(labels) for _, labels in loader)

            rows.append((f"torch DataLoader epoch, batch 256, {workers} workers", *_best(epoch, 1)))
    except ImportError:
        pass
    db.close()
    floor = rows[0][1]
    lines = [
        f"Read side (issue 9): {n} records, LMDB, random order unless said, best of {repeat} "
        "(torch rows: 1 run); ratios against issue 9's raw floor, measured in the same run.",
        "",
        "| reader | records/s | × raw floor |",
        "|---|---|---|",
    ]
    for name, seconds, count in rows:
        lines.append(
            f"| {name} | {count / seconds / 1000:.0f} k | {floor / seconds * count / n:.2f}× |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-read-"))
    try:
        images, labels = work / "train-images-idx3-ubyte", work / "train-labels-idx1-ubyte"
        if (FASHION / "train-images-idx3-ubyte.gz").exists():
            for target in (images, labels):
                with gzip.open(FASHION / (target.name + ".gz")) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench import generate

            images, labels = generate(work, 60_000, "train")
        print("\n".join(read_table(images, labels, work, args.repeat)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
