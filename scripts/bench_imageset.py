"""The imageset rows of the benchmark (issue 26): your own images, ours against Caffe's
``convert_imageset`` and a decode-only floor, ratios from alternating runs of the same call.

Inputs: 2,000 JPEGs cut from scikit-image's photographs (scripts/make_photos.py; the rows
are skipped, saying so, where scikit-image is not installed) and Fashion-MNIST's test set as
10,000 PNG files. Caffe's tool is the binary named by ``MNIST2DB_BENCH_CAFFE`` (its path),
else ``convert_imageset`` of a Caffe build at ``~/anchors/caffe/build/tools``; without one
the Caffe columns say so. Each run is a whole process; CPU is user + system of it and its
children (the workers); peak memory is the largest sum of the resident sets of the process
and its children, sampled every 10 ms.

    python scripts/bench_imageset.py [--repeat 5] [--count 2000] [--markdown FILE]
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

BIN = Path(sys.executable).parent
FASHION = Path("/usr/share/datasets/fashion-mnist")

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
    proportional sets)."""
    shutil.rmtree(out, ignore_errors=True)
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
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    text = "\n".join(imageset_table(args.repeat, args.count)) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def imageset_table(repeat: int = 5, count: int = 2000) -> list[str]:
    """The rows, as Markdown lines."""
    caffe = caffe_tool()
    ours = str(BIN / "convert_imageset")
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-imageset-"))
    lines = [
        f"Your own images (issue 26): medians of {repeat} alternating runs; CPU is user + "
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
            resize = ["--resize_height=256", "--resize_width=256"]
            sets.append((f"{count} photos", work / "photos" / "images", listing,
                         [resize, resize + ["-j=1"], [], ["--encoded"]]))  # fmt: skip
        except ImportError:
            lines.insert(1, "(scikit-image is not installed: no photo rows; "
                            "pip install scikit-image)")  # fmt: skip
        fashion = fashion_pngs(work)
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
                shown = " ".join(flags) or "(none)"
                lines.append(f"| {name} | `{shown}` | {caffe_cols} | {cpu:.2f} "
                             f"| {peak:.0f} | {pss:.0f} | {c_peak_text} |")  # fmt: skip
            floor = [sys.executable, "-c", DECODE_FLOOR, rootarg, str(listing)]
            walls = [run_once(floor, work / "none")[0] for _ in range(repeat)]
            floors.append(f"- decode-only floor, {name}: Pillow's decode of every file in one "
                          f"loop, one process: {statistics.median(walls):.2f} s")  # fmt: skip
        lines += ["", *floors]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return lines


if __name__ == "__main__":
    main()
