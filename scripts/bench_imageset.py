"""The imageset rows of the benchmark: your own images, ours against Caffe's
``convert_imageset``, a decode-only floor and, for the resize, the floor of its work (the
decode and resize in one loop, LMDB's writes, over the cores), ratios from alternating runs.

Inputs: 2,000 JPEGs cut from scikit-image's photographs (scripts/make_photos.py; the rows
are skipped, saying so, where scikit-image is not installed) and Fashion-MNIST's test set as
10,000 PNG files. Caffe's tool is the binary named by ``MNIST2DB_BENCH_CAFFE`` (its path),
else ``convert_imageset`` of a Caffe build at ``~/anchors/caffe/build/tools``; without one
the Caffe columns say so. Each run is a whole process; CPU is user + system of it and its
children (the workers); peak memory is the largest sum of the resident sets of the process
and its children, sampled every 10 ms.

    python scripts/bench_imageset.py [--repeat 5] [--count 2000] [--rows all|resize] [--markdown FILE]

The decoders are those the run's environment gives (``MNIST2DB_NO_OPENCV=1``: the pure path,
for ours and for the floor alike). ``--rows resize``: only the photos' resize rows and floor.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_data import FASHION, byte_compile, warm_memory

BIN = Path(sys.executable).parent

#: The floor: Pillow's decode of every listed file, in one loop, in one process.
DECODE_FLOOR = """
import sys
from PIL import Image
root, listing = sys.argv[1:3]
with open(listing) as f:
    for line in f:
        with Image.open(root + line.rsplit(" ", 1)[0]) as image:
            image.load()
"""


#: The floor of a resize's work: the CPU of decoding and resizing every listed photo, in one
#: loop in one process, with the decoders the run uses (OpenCV's imdecode and INTER_LINEAR
#: resize, or Pillow and mnist2db's numpy resize); prints the CPU seconds and the library.
RESIZE_FLOOR = """
import io, sys, time
import numpy as np
from mnist2db.formats.imread.cv2_wheel import opencv
root, listing, width, height = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(listing) as f:
    paths = [root + line.rsplit(" ", 1)[0] for line in f if line.strip()]
cv2 = opencv()
if cv2 is None:
    from PIL import Image
    from mnist2db.formats.imread.resize import resize_numpy
started = time.process_time()
for path in paths:
    with open(path, "rb") as f:
        data = f.read()
    if cv2 is not None:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    else:
        with Image.open(io.BytesIO(data)) as opened:
            image = np.asarray(opened.convert("RGB"))
        resize_numpy(image, width, height)
print(time.process_time() - started, f"OpenCV {cv2.__version__}" if cv2 else "Pillow and numpy")
"""

#: The other part of that floor: py-lmdb writing that many records of a record's size,
#: a thousand a transaction, each committed as Caffe's and ours are (synced).
LMDB_FLOOR = """
import os, sys
import lmdb
out, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
value = os.urandom(size)
env = lmdb.open(out, map_size=count * (size + 8192) + (64 << 20))
for start in range(0, count, 1000):
    with env.begin(write=True) as txn:
        cursor = txn.cursor()
        for i in range(start, min(count, start + 1000)):
            cursor.put(b"%08d_%06d.jpg" % (i, i), value, append=True)
env.close()
"""

#: The Python floor of the 10,000 PNGs (the ≤ 0.5× row): what any Python process
#: must spend on convert_imageset's job, with none of the work that makes it safe (no checks
#: of the list or the files, no staging, no digest, no error handling): the interpreter's
#: start, the list read once, a worker forked per core decoding with Pillow's own zlib
#: decoder into a kept buffer, the records (Caffe's bytes: 28 × 28 grey PNGs in colour)
#: written to LMDB a thousand a transaction.
PNG_FLOOR = """
import os, struct, sys
import lmdb
root, listing, out = sys.argv[1].encode(), sys.argv[2], sys.argv[3]
with open(listing, "rb") as f:
    entries = [line.rpartition(b" ") for line in f.read().split(b"\\n") if line]
jobs = len(os.sched_getaffinity(0))
chunks = [entries[i : i + 256] for i in range(0, len(entries), 256)]
def varint(v):
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))
def work(chunk, fd, Image, image, buffer):
    records = []
    for path, _, label in chunk:
        f = os.open(root + path, os.O_RDONLY)
        data = os.read(f, 1 << 16)
        os.close(f)
        decoder = Image._getdecoder("L", "zip", "L")
        decoder.setimage(image.im, (0, 0, 28, 28))
        decoder.decode(data[41 : 41 + int.from_bytes(data[33:37], "big")])
        decoder.cleanup()
        records.append(b"\\x08\\x03\\x10\\x1c\\x18\\x1c\\x22\\xb0\\x12" + buffer * 3
                       + b"\\x28" + varint(int(label)) + b"\\x38\\x00")
    blob = b"".join(struct.pack("<I", len(r)) + r for r in records)
    blob = struct.pack("<II", len(blob), len(records)) + blob
    while blob:
        blob = blob[os.write(fd, blob) :]
readers = []
for j in range(jobs):
    r, w = os.pipe()
    if os.fork() == 0:
        from PIL import Image
        buffer = bytearray(784)
        image = Image.frombuffer("L", (28, 28), buffer, "raw", "L", 0, 1)
        for chunk in chunks[j::jobs]:
            work(chunk, w, Image, image, buffer)
        os._exit(0)
    os.close(w)
    readers.append(os.fdopen(r, "rb", buffering=1 << 20))
env = lmdb.open(out, map_size=1 << 30)
batch, line = [], 0
for i, chunk in enumerate(chunks):
    size, count = struct.unpack("<II", readers[i % jobs].read(8))
    blob, at = readers[i % jobs].read(size), 0
    for (path, _, _) in chunk:
        n = struct.unpack_from("<I", blob, at)[0]
        batch.append((b"%08d_" % line + path, blob[at + 4 : at + 4 + n]))
        at, line = at + 4 + n, line + 1
        if len(batch) == 1000:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(batch, append=True)
            batch = []
with env.begin(write=True) as txn:
    txn.cursor().putmulti(batch, append=True)
env.close()
for _ in range(jobs):
    os.wait()
"""


#: The resize of the photo rows (and of the floor of its work).
RESIZE = (256, 256)
RESIZE_FLAGS = [f"--resize_height={RESIZE[1]}", f"--resize_width={RESIZE[0]}"]


def caffe_tool() -> Path | None:
    named = os.environ.get("MNIST2DB_BENCH_CAFFE")
    path = Path(named) if named else Path.home() / "anchors/caffe/build/tools/convert_imageset"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return pids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def _pss(pid: int) -> int:
    """Proportional set size, KiB: a page shared by n processes counts 1/n in each."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def run_once(argv: list[str], out: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s of it and its children, peak KiB summed over them: resident sets and
    proportional sets); started on touched memory (:func:`bench_data.warm_memory`)."""
    shutil.rmtree(out, ignore_errors=True)
    warm_memory()
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pids = _tree(proc.pid)
            peak[0] = max(peak[0], sum(_rss(p) for p in pids))
            peak[1] = max(peak[1], sum(_pss(p) for p in pids))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed ({proc.returncode}):\n{err.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, peak[0], peak[1]


def fashion_pngs(work: Path) -> tuple[Path, Path] | None:
    """Fashion-MNIST's test set as 10,000 PNG files and their list, or None."""
    source = FASHION / "t10k-images-idx3-ubyte.gz"
    if not source.exists():
        return None
    import numpy as np
    from PIL import Image

    images = np.frombuffer(gzip.decompress(source.read_bytes()), np.uint8, offset=16)
    labels = gzip.decompress((FASHION / "t10k-labels-idx1-ubyte.gz").read_bytes())[8:]
    root = work / "fashion"
    root.mkdir()
    lines = []
    for i, image in enumerate(images.reshape(-1, 28, 28)):
        Image.fromarray(image).save(root / f"{i:05d}.png")
        lines.append(f"{i:05d}.png {labels[i]}\n")
    listing = work / "fashion.txt"
    listing.write_text("".join(lines))
    return root, listing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rows", choices=("all", "resize"), default="all")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    byte_compile()
    text = "\n".join(imageset_table(args.repeat, args.count, args.rows == "resize")) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def imageset_table(repeat: int = 5, count: int = 2000, resize_only: bool = False) -> list[str]:
    """The rows, as Markdown lines (``resize_only``: the photos' resize rows alone)."""
    caffe = caffe_tool()
    ours = str(BIN / "convert_imageset")
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-imageset-"))
    lines = [
        f"Your own images: medians of {repeat} alternating runs; CPU is user + "
        "system of the process and its workers; peak is the sum of their resident sets (RSS: "
        "a page shared by the workers counts in each) and of their proportional sets (PSS).",
        "",
        "| set | flags | Caffe wall s | ours wall s | × Caffe | ours CPU / wall | "
        "ours peak RSS MiB | ours peak PSS MiB | Caffe peak MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if caffe is None:
        lines.insert(1, "(no Caffe build found: set MNIST2DB_BENCH_CAFFE to its "
                        "convert_imageset; the Caffe columns are empty)")  # fmt: skip
    try:
        sets: list[tuple[str, Path, Path, list[list[str]]]] = []
        try:
            sys.path.insert(0, str(Path(__file__).parent))
            from make_photos import make_photos

            listing = make_photos(work / "photos", count)
            resize = RESIZE_FLAGS
            flag_sets = [resize, resize + ["-j=1"]] + ([] if resize_only else [[], ["--encoded"]])
            sets.append((f"{count} photos", work / "photos" / "images", listing, flag_sets))
        except ImportError:
            lines.insert(1, "(scikit-image is not installed: no photo rows; "
                            "pip install scikit-image)")  # fmt: skip
        fashion = None if resize_only else fashion_pngs(work)
        if fashion is not None:
            sets.append(("Fashion test, 10,000 PNG", fashion[0], fashion[1], [[]]))
        floors: list[str] = []
        for name, root, listing, flag_sets in sets:
            rootarg = str(root) + "/"
            for flags in flag_sets:
                out = work / "out"
                mine = [ours, *flags, rootarg, str(listing), str(out)]
                theirs = [str(caffe), *[f for f in flags if not f.startswith("-j")],
                          rootarg, str(listing), str(out)] if caffe else None  # fmt: skip
                runs: dict[str, list[tuple[float, float, int, int]]] = {"ours": [], "caffe": []}
                for _ in range(repeat):
                    runs["ours"].append(run_once(mine, out))
                    if theirs:
                        runs["caffe"].append(run_once(theirs, out))
                wall = statistics.median(r[0] for r in runs["ours"])
                cpu = statistics.median(r[1] / r[0] for r in runs["ours"])
                peak = statistics.median(r[2] for r in runs["ours"]) / 1024
                pss = statistics.median(r[3] for r in runs["ours"]) / 1024
                if runs["caffe"]:
                    c_wall = statistics.median(r[0] for r in runs["caffe"])
                    ratio = statistics.median(
                        o[0] / c[0] for o, c in zip(runs["ours"], runs["caffe"], strict=True)
                    )
                    c_peak = statistics.median(r[2] for r in runs["caffe"]) / 1024
                    caffe_cols = f"{c_wall:.2f} | {wall:.2f} | {ratio:.2f}×"
                    c_peak_text = f"{c_peak:.0f}"
                else:
                    caffe_cols, c_peak_text = f"– | {wall:.2f} | –", "–"
                if flags == RESIZE_FLAGS:
                    floors.append(_resize_floor(name, root, listing, work, wall, repeat))
                shown = " ".join(flags) or "(none)"
                lines.append(f"| {name} | `{shown}` | {caffe_cols} | {cpu:.2f} "
                             f"| {peak:.0f} | {pss:.0f} | {c_peak_text} |")  # fmt: skip
            floor = [sys.executable, "-c", DECODE_FLOOR, rootarg, str(listing)]
            walls = [run_once(floor, work / "none")[0] for _ in range(repeat)]
            floors.append(f"- decode-only floor, {name}: Pillow's decode of every file in one "
                          f"loop, one process: {statistics.median(walls):.2f} s")  # fmt: skip
            if name.startswith("Fashion"):
                floors.append(_python_floor(rootarg, listing, work / "out", caffe, repeat))
        lines += ["", *floors]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lines


def _resize_floor(name: str, root: Path, listing: Path, work: Path, wall: float,
                  repeat: int) -> str:  # fmt: skip
    """The line of :data:`RESIZE_FLOOR` + :data:`LMDB_FLOOR` over the cores, and ours (the
    resize row's median ``wall``) against it."""
    count = sum(1 for line in listing.read_text().splitlines() if line.strip())
    size = 3 * RESIZE[0] * RESIZE[1] + 16  # a colour Datum's pixels and its fields
    cpus, library = [], ""
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", RESIZE_FLOOR, str(root) + "/", str(listing), *map(str, RESIZE)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        cpu, library = done.stdout.split(" ", 1)
        cpus.append(float(cpu))
    lmdb_run = [sys.executable, "-c", LMDB_FLOOR, str(work / "floor_lmdb"), str(count), str(size)]
    writes = [run_once(lmdb_run, work / "floor_lmdb")[0] for _ in range(repeat)]
    cores = len(os.sched_getaffinity(0))
    cpu, write = statistics.median(cpus), statistics.median(writes)
    floor = (cpu + write) / cores
    return (f"- resize floor, {name} to {RESIZE[0]} × {RESIZE[1]}: ({cpu:.2f} s of CPU decoding "
            f"and resizing in one loop with {library.strip()} + {write:.2f} s of py-lmdb writing "
            f"{count} records of {size} bytes, 1000 a transaction) / {cores} cores = {floor:.2f} s; "
            f"ours with `{' '.join(RESIZE_FLAGS)}`: {wall:.2f} s, {wall / floor:.2f}× the floor")  # fmt: skip


def _python_floor(root: str, listing: Path, out: Path, caffe: Path | None, repeat: int) -> str:
    """:data:`PNG_FLOOR`'s line: its wall and CPU, and its wall against Caffe's, alternating."""
    floor = [sys.executable, "-c", PNG_FLOOR, root, str(listing), str(out)]
    runs = []
    for _ in range(repeat):
        ran = run_once(floor, out)
        theirs = run_once([str(caffe), root, str(listing), str(out)], out) if caffe else None
        runs.append((ran, theirs))
    wall = statistics.median(r[0][0] for r in runs)
    cpu = statistics.median(r[0][1] for r in runs)
    ratio = (f", {statistics.median(r[0][0] / r[1][0] for r in runs if r[1]):.2f}× Caffe's wall "
             "in the same alternation") if caffe else ""  # fmt: skip
    return (f"- Python floor, Fashion's PNGs (the job with no checks, staging or digest: "
            f"scripts/bench_imageset.py PNG_FLOOR): {wall:.2f} s, {cpu:.2f} s of CPU{ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
