"""The export side of the benchmark: ``export --to files`` and ``--to webdataset``
against ``cat`` and against ``convert --encoded png``, in the same run.

Rows, each a whole process (start-up included), medians of ``--repeat`` alternating runs,
every run starting with no dirty data waiting for the disk; wall seconds and the CPU
seconds (user + system) of the process and its children:
* encoded records, two sizes: ``--jpegs`` generated 256 × 256 JPEGs (~40 KB each, 3000:
  124 MB) in a ``convert_imageset --encoded`` LMDB, and a large database (``--large``
  records, 50,000: ~2 GB) of the same JPEGs copied again and again under 50,000 names, as
  ``convert_imageset --encoded`` writes a list of such files (written here directly: the
  same keys and values, in seconds rather than a minute). For each: ``cat`` of the same
  bytes (the JPEG files concatenated beforehand) into one file on the same disk, and the
  same followed by ``sync FILE`` (an export flushes what it writes: its output survives a
  crash); ``export --to webdataset`` and its floor, the SHA-256 of the same bytes
  (:data:`HASH`); ``export --to files`` and its floor, ``tar -x`` of a
  tar of the very tree the export writes (the same files, created by a C tool), then
  ``sync -f`` (the export flushes its file system once, syncfs, before the rename that
  makes its tree appear; the trees of many files are deleted only at the end, where the
  disk has room: :data:`KEEP_FREE`). The small size is what earlier runs
  measured: there a Python process's start-up alone is longer than ``cat``'s whole copy.
  The large one measures throughput;
* raw 28 × 28 records (Fashion-MNIST's training set, else generated): ``convert --encoded
  png`` of the IDX files, and ``export --to webdataset`` / ``--to files`` of the raw LMDB
  (each record becomes a PNG), and the ``tar -x`` floor of the tree;
* the start-up alone (``mnist2db export --help``: Python and the imports an export needs).

The targets are read from the whole processes (the start-up counted); the start-up's
share is shown beside them, never taken off them.

    python scripts/bench_export.py [--repeat 3] [--jpegs 3000] [--large 50000] [--work /dev/shm]
    (also a table of scripts/bench.py)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_data import byte_compile, gunzip_or_generate, reap

BIN = Path(sys.executable).parent


#: The free space a run leaves on the work directory's file system for the trees of many
#: files it sets aside (below it, they are deleted between rounds, and the next round waits
#: :data:`SETTLE_SECONDS`). ext4 without a journal (this project's test machine's disk) does
#: not reuse an inode freed less than 60 s after its inode table block reached the disk (360
#: s while that block is dirty, as it is again once a new file's inode is written in it):
#: every file creation in that inode's group scans past each such inode
#: (``recently_deleted``, in ``find_inode_bit``), so a tree of 60,000 files deleted before a
#: run slowed the next run's creation of 60,000 files 3 to 10 times (the ``tar -x`` floor of
#: the raw tree, run right after the export's tree was deleted: 41.7 s, against 2.9-3.5 s
#: with no deletion before it). The trees of many files (``--to files`` and its floors) are
#: therefore set aside after their run and deleted at the end, so that no run pays for
#: another's deletion.
KEEP_FREE = 16 << 30
SETTLE_SECONDS = 370


def file_system(path: Path) -> str:
    """The type of the file system holding ``path`` (``ext4``, ``tmpfs``, …; "" if unknown)."""
    where = os.path.realpath(path)
    found, longest = "", -1
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                point = fields[1].replace("\\040", " ")
                inside = where == point or where.startswith(point.rstrip("/") + "/")
                if len(fields) > 2 and inside and len(point) > longest:
                    found, longest = fields[2], len(point)
    except OSError:
        return ""
    return found


def run_once(
    argv: list[str], out: Path, aside: Path | None = None
) -> tuple[float, float, int, int]:
    """Run one process; returns (wall s, CPU s, peak RSS KiB, peak sampled RssAnon KiB).
    Its output is deleted, or moved into ``aside`` (a tree of many files: :data:`KEEP_FREE`)."""
    wall, cpu, rss, anon, _ = reap(argv, out)
    if aside is not None and out.exists():
        out.rename(aside / str(len(list(aside.iterdir()))))
    else:
        shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, rss, anon


def settle(aside: Path, wait: bool = True) -> None:
    """Delete the trees set aside, flush, and (``wait``) give ext4 time to reuse their
    inodes freely."""
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    os.sync()
    if wait:
        time.sleep(SETTLE_SECONDS)


def make_jpegs(work: Path, count: int) -> tuple[Path, list[bytes]]:
    """``count`` JPEGs in ``work/jpegs`` and their list; returns the LMDB ``convert_imageset
    --encoded`` makes of them, and its values (records) in key order."""
    import lmdb
    import numpy as np
    from PIL import Image

    from mnist2db.caffe_tools.convert_imageset import convert_imageset

    folder = work / "jpegs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:256, 0:256]
    lines = []
    for i in range(count):
        a, b = rng.uniform(0.01, 0.1, 2)
        wave = (127 + 100 * np.sin(a * x + b * y + i))[..., None]
        pixels = np.clip(wave + rng.normal(0, 30, (256, 256, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)
        lines.append(f"{i:06d}.jpg {i % 10}\n")
    (work / "jpegs.txt").write_text("".join(lines))
    db = work / "jpeg_lmdb"
    if convert_imageset(["--encoded", f"{folder}/", str(work / "jpegs.txt"), str(db)]) != 0:
        raise SystemExit("benchmark: convert_imageset --encoded failed")
    shutil.rmtree(folder)
    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        values = [bytes(value) for _, value in txn.cursor()]
    env.close()
    return db, values


def write_large(work: Path, values: list[bytes], count: int) -> Path:
    """The LMDB ``convert_imageset --encoded`` writes for a list of ``count`` files, file
    ``i`` a copy of file ``i % len(values)`` of ``values`` (its key ``%08d_%06d.jpg`` of
    ``i`` twice, its label ``i % 10`` as in the small list, its value that file's record):
    ``count`` distinct names, so that ``--to files`` writes every record's file (a list
    naming 3000 files again and again, as earlier runs had it, made it write 3000 files
    and compare the other 47,000 records with them). Written with py-lmdb directly: the
    same keys and values."""
    import lmdb

    db = work / "large_lmdb"
    size = sum(len(values[i % len(values)]) for i in range(count))
    env = lmdb.open(str(db), map_size=size + size // 4 + (64 << 20), sync=False)
    for start in range(0, count, 1000):
        with env.begin(write=True) as txn:
            for i in range(start, min(count, start + 1000)):
                key = b"%08d_%06d.jpg" % (i, i)
                txn.put(key, values[i % len(values)], append=True)
    env.sync(True)
    env.close()
    return db


def joined_bytes(db: Path, target: Path) -> int:
    """Write the image bytes of ``db``'s records, concatenated in key order, to ``target``
    (what ``cat`` copies); returns their size."""
    from mnist2db.storage.databases.readers import iter_db

    size = 0
    with open(target, "wb") as joined:
        for _, datum in iter_db(db):
            joined.write(datum.data)
            size += len(datum.data)
    return size


def tree_tar(db: Path, work: Path, kind: str, aside: Path) -> Path:
    """A tar of the tree ``export --to files`` writes of ``db`` (for the ``tar -x`` floor);
    the tree is set aside (:data:`KEEP_FREE`)."""
    import mnist2db

    tree = work / f"tree-{kind}"
    mnist2db.export_files(db, tree)
    tar = work / f"tree-{kind}.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(tar), "."], check=True)
    tree.rename(aside / tree.name)
    return tar


#: The rows that are a floor or a contender, not an export (no rate of their own).
START = "the start-up alone (mnist2db export --help)"

#: The SHA-256 floor of ``--to webdataset``: the manifest's digest of every shard is the
#: export's own work that ``cat`` does not do. One Python process (the export's start-up
#: counted, as in the export's row) hashing the joined bytes with hashlib (OpenSSL's, as
#: the export's) in the export's 4 MiB writes; it writes nothing.
HASH = """
import hashlib, sys
digest = hashlib.sha256()
with open(sys.argv[1], "rb", buffering=0) as f:
    while chunk := f.read(4 << 20):
        digest.update(chunk)
"""


def export_table(
    images: Path, labels: Path, work: Path, repeat: int = 3, jpegs: int = 3000,
    large: int = 50000,
) -> list[str]:  # fmt: skip
    """Markdown rows of the export benchmark and its two targets."""
    import mnist2db

    m2d = str(BIN / "mnist2db")
    jpeg_db, values = make_jpegs(work, jpegs)
    sizes = {"small": joined_bytes(jpeg_db, work / "jpegs-small.bin")}
    dbs = {"small": jpeg_db}
    if large:
        dbs["large"] = write_large(work, values, large)
        sizes["large"] = joined_bytes(dbs["large"], work / "jpegs-large.bin")
    del values
    raw_db = work / "raw_train_lmdb"
    mnist2db.convert(images, labels, raw_db)
    out = work / "out-export"
    aside = work / "set-aside"
    aside.mkdir()
    # Only ext4 (without a journal, :data:`KEEP_FREE`) makes a run pay for another's
    # deletions; elsewhere (tmpfs: memory) each tree is deleted after its run.
    keep = file_system(work) == "ext4"
    untar = "mkdir {out} && tar -C {out} --no-same-owner --no-same-permissions -m -xf {tar} && sync -f {out}"
    contenders: dict[str, list[str]] = {START: [m2d, "export", "--help"]}
    for size, db in dbs.items():
        joined = work / f"jpegs-{size}.bin"
        what = f"{size}: {sizes[size] / 1e6:.0f} MB of JPEG records"
        tar = tree_tar(db, work, size, aside)
        contenders |= {
            f"cat ({what})": ["sh", "-c", f"mkdir {out} && cat {joined} > {out}/all"],
            f"cat, then sync FILE ({what})": ["sh", "-c", f"mkdir {out} && cat {joined} > {out}/all && sync {out}/all"],
            f"floor: SHA-256 of the same bytes, nothing written ({what})": [sys.executable, "-c", HASH, str(joined)],
            f"export --to webdataset ({what})": [m2d, "export", "-q", "--to", "webdataset", str(db), f"{out}/s"],
            f"export --to files ({what})": [m2d, "export", "-q", "--to", "files", str(db), str(out)],
            f"floor: tar -x of that tree, then sync -f ({what})": ["sh", "-c", untar.format(out=out, tar=tar)],
        }  # fmt: skip
    tar = tree_tar(raw_db, work, "raw", aside)
    contenders |= {
        "convert --encoded png (28 × 28)": [m2d, "convert", "-q", "--encoded", "png", str(images), str(labels), str(out)],
        "export --to webdataset (raw 28 × 28 -> PNG)": [m2d, "export", "-q", "--to", "webdataset", str(raw_db), f"{out}/s"],
        "export --to files (raw 28 × 28 -> PNG)": [m2d, "export", "-q", "--to", "files", str(raw_db), str(out)],
        "floor: tar -x of that tree, then sync -f (raw 28 × 28 -> PNG)": ["sh", "-c", untar.format(out=out, tar=tar)],
    }  # fmt: skip
    runs: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in contenders}
    for round_ in range(repeat):
        if keep and round_ and shutil.disk_usage(work).free < KEEP_FREE:
            settle(aside)
        for name, argv in contenders.items():  # alternating: one run of each, then again
            many = keep and name.startswith(("export --to files", "floor:"))
            runs[name].append(run_once(argv, out, aside if many else None))
    settle(aside, wait=False)
    wall = {name: statistics.median(r[0] for r in found) for name, found in runs.items()}
    cpu = {name: statistics.median(r[1] for r in found) for name, found in runs.items()}
    records = len(mnist2db.open_db(raw_db))
    load = os.getloadavg()
    lines = [
        f"Export, in {work} ({file_system(work) or 'file system unknown'}): JPEG "
        f"records of 256 × 256, {jpegs} "
        + (f"and {large} " if large else "")
        + f"({', '.join(f'{s / 1e6:.1f} MB' for s in sizes.values())}), {records} raw 28 × 28 "
        f"records; medians of {repeat} alternating runs; load average at the end "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}.",
        "",
        "| contender | wall s | CPU s | MB/s or records/s | peak RSS MB | RssAnon MB |",
        "|---|---|---|---|---|---|",
    ]
    for name, found in runs.items():
        size = next((sizes[k] for k in sizes if f"({k}:" in name), None)
        rate = (
            "-"
            if name == START
            else f"{size / 1e6 / wall[name]:.0f} MB/s"
            if size is not None
            else f"{records / wall[name]:.0f} records/s"
        )
        rss = statistics.median(r[2] for r in found) / 1024
        anon = statistics.median(r[3] for r in found) / 1024
        lines.append(
            f"| {name} | {wall[name]:.3f} | {cpu[name]:.2f} | {rate} | {rss:.1f} | {anon:.1f} |"
        )
    start = wall[START]
    lines += ["", "Targets (same run; whole processes, the start-up counted):", ""]
    for size in sizes:
        what = f"{size}: {sizes[size] / 1e6:.0f} MB of JPEG records"
        cat, synced = wall[f"cat ({what})"], wall[f"cat, then sync FILE ({what})"]
        for kind in ("webdataset", "files"):
            own = wall[f"export --to {kind} ({what})"]
            lines.append(
                f"- encoded records ({size}), --to {kind}: {cat / own:.0%} of cat's speed "
                f"(target ≥ 80%: {'met' if cat / own >= 0.8 else 'NOT met'}); {synced / own:.0%} "
                f"of cat + sync; the start-up is {start / own:.0%} of the export's time"
            )
        hashed = wall[f"floor: SHA-256 of the same bytes, nothing written ({what})"]
        own = wall[f"export --to webdataset ({what})"]
        lines.append(
            f"- --to webdataset ({size}): {hashed / own:.0%} of the speed of hashing the same "
            f"bytes alone (the manifest's SHA-256), a floor itself at {cat / hashed:.0%} of "
            "cat's speed"
        )
        floor = wall[f"floor: tar -x of that tree, then sync -f ({what})"]
        own = wall[f"export --to files ({what})"]
        lines.append(
            f"- --to files ({size}): {floor / own:.0%} of the speed of creating the same files "
            f"with tar -x and sync -f, a floor itself at {cat / floor:.0%} of cat's speed"
        )
    png = wall["convert --encoded png (28 × 28)"]
    for kind in ("webdataset", "files"):
        own = wall[f"export --to {kind} (raw 28 × 28 -> PNG)"]
        lines.append(
            f"- raw 28 × 28 to PNG, --to {kind}: {png / own:.2f}× the speed of convert "
            f"--encoded png (target ≥ 1: {'met' if png / own >= 1 else 'NOT met'})"
        )
    floor = wall["floor: tar -x of that tree, then sync -f (raw 28 × 28 -> PNG)"]
    own = wall["export --to files (raw 28 × 28 -> PNG)"]
    lines.append(
        f"- --to files (raw 28 × 28 -> PNG): {floor / own:.0%} of the speed of creating the "
        f"same files with tar -x and sync -f, a floor itself at {png / floor:.2f}× the "
        "speed of convert --encoded png"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jpegs", type=int, default=3000, help="distinct JPEGs (the small size)")
    parser.add_argument(
        "--large", type=int, default=50000, help="records of the large size (0: none)"
    )
    parser.add_argument(
        "--work", type=Path, default=None,
        help="the folder to work in (default: the temporary folder; /dev/shm: tmpfs, where "
        "no file system's own state weighs on --to files)",
    )  # fmt: skip
    args = parser.parse_args()
    byte_compile()
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-export-", dir=args.work))
    try:
        data, _ = gunzip_or_generate(work)
        print("\n".join(export_table(*data["train"], work, args.repeat, args.jpegs, args.large)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
