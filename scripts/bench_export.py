"""The export side of the benchmark (issue 29): ``export --to files`` and ``--to webdataset``
against ``cat`` and against ``convert --encoded png``, in the same run.

Rows, each a whole process (start-up included), medians of ``--repeat`` alternating runs,
every run starting with no dirty data waiting for the disk:
* encoded records (generated 256 × 256 JPEGs, ~40 KB each, in a ``convert_imageset
  --encoded`` LMDB): ``cat`` of the same bytes (the JPEG files concatenated beforehand) into
  one file on the same disk, and the same followed by ``sync FILE`` (an export flushes what
  it writes: its output survives a crash); ``export --to webdataset``; ``export --to files``;
* raw 28 × 28 records (Fashion-MNIST's training set, else generated): ``convert --encoded
  png`` of the IDX files, and ``export --to webdataset`` / ``--to files`` of the raw LMDB
  (each record becomes a PNG);
* the floor of ``--to files`` on this disk: ``tar -x`` of a tar of the very tree the export
  writes (the same files, created by a C tool), then ``sync -f`` (the export flushes its
  file system once, syncfs, before the rename that makes its tree appear); and the start-up
  alone (``mnist2db export --help``: Python and the imports an export needs).

    python scripts/bench_export.py [--repeat 3] [--jpegs 3000]   (also a table of scripts/bench.py)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_data import gunzip_or_generate

BIN = Path(sys.executable).parent


def make_jpegs(work: Path, count: int) -> tuple[Path, Path, int]:
    """``count`` JPEGs in ``work/jpegs`` and their list; returns (the LMDB ``convert_imageset
    --encoded`` makes of them, the file of their bytes concatenated, its size)."""
    import numpy as np
    from PIL import Image

    from mnist2db.caffe_tools.convert_imageset import convert_imageset

    folder = work / "jpegs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:256, 0:256]
    lines = []
    with open(work / "jpegs.bin", "wb") as joined:
        for i in range(count):
            a, b = rng.uniform(0.01, 0.1, 2)
            wave = (127 + 100 * np.sin(a * x + b * y + i))[..., None]
            pixels = np.clip(wave + rng.normal(0, 30, (256, 256, 3)), 0, 255).astype(np.uint8)
            path = folder / f"{i:06d}.jpg"
            Image.fromarray(pixels).save(path, quality=90)
            joined.write(path.read_bytes())
            lines.append(f"{path.name} {i % 10}\n")
    (work / "jpegs.txt").write_text("".join(lines))
    db = work / "jpeg_lmdb"
    if convert_imageset(["--encoded", f"{folder}/", str(work / "jpegs.txt"), str(db)]) != 0:
        raise SystemExit("benchmark: convert_imageset --encoded failed")
    shutil.rmtree(folder)
    return db, work / "jpegs.bin", (work / "jpegs.bin").stat().st_size


def export_table(
    images: Path, labels: Path, work: Path, repeat: int = 3, jpegs: int = 3000
) -> list[str]:
    """Markdown rows of the export benchmark and its two targets (issue 29)."""
    from bench import run_once  # the reaper and the clean start of every run

    import mnist2db

    m2d = str(BIN / "mnist2db")
    jpeg_db, joined, joined_size = make_jpegs(work, jpegs)
    raw_db = work / "raw_train_lmdb"
    mnist2db.convert(images, labels, raw_db)
    out = work / "out-export"
    trees = {}
    for kind, db in (("jpeg", jpeg_db), ("raw", raw_db)):  # the trees the export writes, as tars
        tree = work / f"tree-{kind}"
        mnist2db.export_files(db, tree)
        trees[kind] = work / f"tree-{kind}.tar"
        subprocess.run(["tar", "-C", str(tree), "-cf", str(trees[kind]), "."], check=True)
        shutil.rmtree(tree)
    untar = "mkdir {out} && tar -C {out} --no-same-owner --no-same-permissions -m -xf {tar} && sync -f {out}"
    contenders: dict[str, list[str]] = {
        "cat: the JPEG bytes into one file": ["sh", "-c", f"mkdir {out} && cat {joined} > {out}/all"],
        "cat, then sync FILE": ["sh", "-c", f"mkdir {out} && cat {joined} > {out}/all && sync {out}/all"],
        "floor: the start-up alone (mnist2db export --help)": [m2d, "export", "--help"],
        "export --to webdataset (JPEG records)": [m2d, "export", "-q", "--to", "webdataset", str(jpeg_db), f"{out}/s"],
        "export --to files (JPEG records)": [m2d, "export", "-q", "--to", "files", str(jpeg_db), str(out)],
        "floor: tar -x of that tree, then sync -f (JPEG records)": ["sh", "-c", untar.format(out=out, tar=trees["jpeg"])],
        "convert --encoded png (28 × 28)": [m2d, "convert", "-q", "--encoded", "png", str(images), str(labels), str(out)],
        "export --to webdataset (raw 28 × 28 -> PNG)": [m2d, "export", "-q", "--to", "webdataset", str(raw_db), f"{out}/s"],
        "export --to files (raw 28 × 28 -> PNG)": [m2d, "export", "-q", "--to", "files", str(raw_db), str(out)],
        "floor: tar -x of that tree, then sync -f (raw 28 × 28 -> PNG)": ["sh", "-c", untar.format(out=out, tar=trees["raw"])],
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in contenders}
    peaks: dict[str, list[int]] = {name: [] for name in contenders}
    anons: dict[str, list[int]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, argv in contenders.items():  # alternating: one run of each, then again
            wall, rss, anon, _, _ = run_once(argv, out)
            times[name].append(wall)
            peaks[name].append(rss)
            anons[name].append(anon)
    median = {name: statistics.median(values) for name, values in times.items()}
    records = len(mnist2db.open_db(raw_db))
    lines = [
        f"Export (issue 29): {jpegs} JPEG records of 256 × 256 ({joined_size / 1e6:.1f} MB), "
        f"{records} raw 28 × 28 records; medians of {repeat} alternating runs.",
        "",
        "| contender | wall s | MB/s or records/s | peak RSS MB | RssAnon MB |",
        "|---|---|---|---|---|",
    ]
    for name in contenders:
        rate = (
            "-"
            if "start-up" in name
            else f"{joined_size / 1e6 / median[name]:.0f} MB/s"
            if "JPEG" in name or name.startswith("cat")
            else f"{records / median[name]:.0f} records/s"
        )
        lines.append(
            f"| {name} | {median[name]:.3f} | {rate} | {statistics.median(peaks[name]) / 1024:.1f} "
            f"| {statistics.median(anons[name]) / 1024:.1f} |"
        )
    cat, synced = median["cat: the JPEG bytes into one file"], median["cat, then sync FILE"]
    png = median["convert --encoded png (28 × 28)"]
    lines += ["", "Targets (issue 29, same run):", ""]
    for kind in ("webdataset", "files"):
        own = median[f"export --to {kind} (JPEG records)"]
        lines.append(
            f"- encoded records, --to {kind}: {cat / own:.0%} of cat's speed (target ≥ 80%: "
            f"{'met' if cat / own >= 0.8 else 'NOT met'}); {synced / own:.0%} of cat + sync"
        )
    for kind in ("webdataset", "files"):
        own = median[f"export --to {kind} (raw 28 × 28 -> PNG)"]
        lines.append(
            f"- raw 28 × 28 to PNG, --to {kind}: {png / own:.2f}× the speed of convert "
            f"--encoded png (target ≥ 1: {'met' if png / own >= 1 else 'NOT met'})"
        )
    start = median["floor: the start-up alone (mnist2db export --help)"]
    lines.append(f"- the start-up alone takes {start / cat:.1f}× cat's whole time")
    floor = median["floor: tar -x of that tree, then sync -f (JPEG records)"]
    own = median["export --to files (JPEG records)"]
    lines.append(
        f"- --to files (JPEG records): {floor / own:.0%} of the speed of creating the same "
        f"files with tar -x and sync -f, a floor itself at {cat / floor:.0%} of cat's speed"
    )
    floor = median["floor: tar -x of that tree, then sync -f (raw 28 × 28 -> PNG)"]
    own = median["export --to files (raw 28 × 28 -> PNG)"]
    lines.append(
        f"- --to files (raw 28 × 28 -> PNG): {floor / own:.0%} of the speed of creating the "
        f"same files with tar -x and sync -f, a floor itself at {png / floor:.2f}× the "
        "speed of convert --encoded png"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jpegs", type=int, default=3000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-export-"))
    try:
        data, _ = gunzip_or_generate(work)
        print("\n".join(export_table(*data["train"], work, args.repeat, args.jpegs)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
