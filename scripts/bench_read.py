"""The read side of the benchmark: open_db against the raw py-lmdb floor.

Rows, all over the same 60 000-record LMDB (Fashion-MNIST's training set, else generated),
best of ``--repeat`` runs each, in this process:
* raw floor: one read transaction, ``txn.get(b"%08d" % i)`` + ``numpy.frombuffer`` of the
    784 pixel bytes, random order (no copy, no label), the least a reader can do; and the same
  loop with every name pre-bound to a local (the least Python can do);
* ``open_db`` ``db[i]`` in the same random order, sequential iteration, ``__getitems__``
  of 256 indices, ``read_range`` of 256; the page check every open of an LMDB database
  makes before liblmdb maps it (storage/lmdb_pages);
* torchvision's ``FashionMNIST[i]`` (``PILToTensor``) when torchvision is importable;
* a torch ``DataLoader`` epoch (batch 256, shuffled; 0 and 2 workers) when torch is;
* PNG records (Fashion-MNIST's test set, each PNG compression ``convert`` offers):
  ``db[i]``, ``__getitems__`` of 500, iteration, protobuf + Pillow per image, and NVIDIA
  DALI's CPU pipeline where an environment has it (.venv-dali, or $MNIST2DB_BENCH_DALI).

    python scripts/bench_read.py [--repeat 3] [--png-only]   (also the last table of scripts/bench.py)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_data import gunzip_or_generate

ROOT = Path(__file__).resolve().parent.parent


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
    from mnist2db.storage.databases.checks import check_lmdb_file

    db_path = work / "read_train_lmdb"
    mnist2db.convert(images, labels, db_path, backend="lmdb")
    db = mnist2db.open_db(db_path)
    n = len(db)
    order = np.random.default_rng(0).permutation(n).tolist()
    rows: list[tuple[str, float, int]] = []

    def raw_floor() -> int:
        # The raw floor, written as one would: one read transaction, get + frombuffer.
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
    rows.append(("raw floor: txn.get + numpy.frombuffer", min(timings["floor"]), n))
    rows.append(("raw floor, every name pre-bound to a local", min(timings["prebound"]), n))
    rows.append(("open_db db[i] (fresh writable array, int label)", min(timings["db"]), n))
    db = mnist2db.open_db(db_path)
    rows.append(("open_db iteration, sequential", *_best(db_iterate, repeat)))
    rows.append(("open_db __getitems__ of 256, random", *_best(db_getitems, repeat)))
    rows.append(("open_db read_range of 256, sequential", *_best(db_read_range, repeat)))

    def page_check() -> int:
        # What every open of an LMDB database costs first (storage/lmdb_pages): the rate
        # is records checked a second, against an epoch's records read a second above.
        fd = os.open(db_path, os.O_RDONLY)
        try:
            check_lmdb_file(str(db_path), fd)
        finally:
            os.close(fd)
        return n

    rows.append(
        ("page check on opening (every page liblmdb can reach)", *_best(page_check, repeat))
    )
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
        f"Read side: {n} records, LMDB, random order unless said, best of {repeat} "
        "(torch rows: 1 run); ratios against the raw floor, measured in the same run.",
        "",
        "| reader | records/s | × raw floor |",
        "|---|---|---|",
    ]
    for name, seconds, count in rows:
        lines.append(
            f"| {name} | {count / seconds / 1000:.0f} k | {floor / seconds * count / n:.2f}× |"
        )
    return lines


def dali_python() -> Path | None:
    """The interpreter of an environment with NVIDIA DALI: $MNIST2DB_BENCH_DALI, else the
    repository's .venv-dali (make test-dali), else None (the DALI rows are left out)."""
    named = os.environ.get("MNIST2DB_BENCH_DALI")
    candidate = Path(named) if named else ROOT / ".venv-dali" / "bin" / "python"
    return candidate if candidate.exists() else None


def _dali_rate(python: Path, db: Path, kind: str) -> float:
    out = subprocess.run(
        [str(python), str(ROOT / "scripts" / "bench_dali.py"), str(db), kind, "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.split()[-1])


def _png_compressions() -> list[str | None]:
    """The PNG compressions ``convert`` offers (``png_compression=``), default first; [None]
    where it offers one only."""
    from mnist2db.formats.png import encoder as png

    offered = getattr(png, "PNG_COMPRESSIONS", None)
    if not offered:
        return [None]
    default = getattr(png, "DEFAULT_PNG_COMPRESSION", offered[0])
    return [default, *(c for c in offered if c != default)]


def png_read_table(
    images: Path, labels: Path, work: Path, repeat: int = 5
) -> tuple[list[str], dict[str, float]]:
    """Reading PNG records: open_db (db[i], __getitems__ of 500, iteration)
    against Pillow per image and, where installed, NVIDIA DALI's CPU pipeline (in its own
    process), over the same LMDB, one per PNG compression ``convert`` offers, every reader
    measured in turn ``repeat`` times (best of each). Returns Markdown rows and the rates
    (records/s) of the default compression's database."""
    import inspect
    import io

    import lmdb
    from PIL import Image

    import mnist2db
    from mnist2db.formats.datum.message import decode_datum

    python = dali_python()
    compressions = _png_compressions()
    if "png_compression" not in inspect.signature(mnist2db.convert).parameters:
        compressions = compressions[:1]  # the encoder offers more than convert takes yet
    databases = {}
    for compression in compressions:
        databases[compression] = work / f"png_{compression or 'default'}_lmdb"
        options = {} if compression is None else {"png_compression": compression}
        mnist2db.convert(images, labels, databases[compression], backend="lmdb",
                         encoded="png", **options)  # fmt: skip
    with mnist2db.open_db(databases[compressions[0]]) as db:
        n = len(db)
    order = np.random.default_rng(0).permutation(n).tolist()

    # Each reader opens the database first, untimed (as DALI's pipeline is built and run
    # once before its epochs are timed): the rows time reading only.
    def db_random(db: mnist2db.DatumDataset) -> None:
        for i in order:
            db[i]

    def db_getitems(db: mnist2db.DatumDataset) -> None:
        for start in range(0, n, 500):
            db.__getitems__(order[start : start + 500])

    def db_iterate(db: mnist2db.DatumDataset) -> None:
        for _ in db:
            pass

    def pillow_random(txn: lmdb.Transaction) -> None:
        # The general reader: protobuf, then Pillow on each image (as torchvision).
        for i in order:
            datum = decode_datum(txn.get(b"%08d" % i))
            with Image.open(io.BytesIO(datum.data)) as image:
                np.asarray(image)[np.newaxis].copy()

    def timed(key: str, db_path: Path) -> float:
        """Seconds per record of one pass of reader ``key`` over ``db_path``."""
        if key == "pillow":
            env = lmdb.open(str(db_path), readonly=True, lock=False, readahead=False)
            with env.begin() as txn:
                start = time.perf_counter()
                pillow_random(txn)
                seconds = time.perf_counter() - start
            env.close()
            return seconds / n
        read = {"db[i]": db_random, "getitems": db_getitems, "iterate": db_iterate}[key]
        with mnist2db.open_db(db_path) as db:
            start = time.perf_counter()
            read(db)
            return (time.perf_counter() - start) / n

    names = {
        "db[i]": "open_db db[i], random order",
        "getitems": "open_db __getitems__ of 500, random order",
        "iterate": "open_db iteration, sequential",
        "pillow": "protobuf + Pillow per image, random order (before)",
        "dali": "NVIDIA DALI CPU pipeline (caffe reader + decoders.image GRAY, 2 threads, batch 500)",
    }
    timings: dict[tuple[str | None, str], list[float]] = {}
    for _ in range(repeat):  # in turn, so that each meets the machine's load alike
        for compression, db_path in databases.items():
            for key in ("db[i]", "getitems", "iterate", "pillow"):
                timings.setdefault((compression, key), []).append(timed(key, db_path))
            if python is not None:
                seconds = 1 / _dali_rate(python, db_path, "png")
                timings.setdefault((compression, "dali"), []).append(seconds)
    rates = {k: 1 / min(v) for k, v in timings.items()}
    lines = [
        f"PNG records: {n} records, LMDB written by `convert --encoded png`"
        + (" (each `--png-compression`)" if compressions != [None] else "")
        + f", best of {repeat}, every reader measured in turn; ratios against Pillow per "
        "image"
        + (" and DALI" if python is not None else " (DALI not installed: make test-dali)")
        + " on the same database, in the same run.",
        "",
        "| database | reader | records/s | × Pillow | × DALI |",
        "|---|---|---|---|---|",
    ]
    for compression in compressions:
        for key, name in names.items():
            rate = rates.get((compression, key))
            if rate is None:
                continue
            dali = rates.get((compression, "dali"))
            lines.append(
                f"| {compression or 'png'} | {name} | {rate / 1000:.0f} k "
                f"| {rate / rates[(compression, 'pillow')]:.2f}× "
                f"| {f'{rate / dali:.2f}×' if dali else '-'} |"
            )
    return lines, {key: rate for (c, key), rate in rates.items() if c == compressions[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--png-only", action="store_true", help="the PNG table only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-read-"))
    try:
        data, _ = gunzip_or_generate(work)
        if not args.png_only:
            print("\n".join(read_table(*data["train"], work, args.repeat)))
            print()
        print("\n".join(png_read_table(*data["test"], work, args.repeat)[0]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
