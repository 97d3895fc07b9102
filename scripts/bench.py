"""Benchmark mnist2db against the naive Python converter and the backends' own floors.

Every contender runs as its own process, several times, the contenders alternating; the
medians of wall time and peak RSS (``wait4`` rusage of that child) are printed, with the
anonymous memory (``RssAnon`` in ``/proc/PID/status``) sampled while it runs. Ratios are
against the naive converter measured in the same run. Inputs are plain IDX files: Debian's
Fashion-MNIST gunzipped into a temporary directory (Caffe's tool needs plain files, and so
every contender reads the same bytes), else a generated 60 000 + 10 000 record dataset.

    python scripts/bench.py [--repeat 5] [--scale 10000,100000,1000000] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench_data import byte_compile, generate, gunzip_or_generate, reap
from bench_export import export_table
from bench_imageset import imageset_table
from bench_read import png_read_table, read_table

BIN = Path(sys.executable).parent

#: The naive converter: what most published scripts do. Run with ``python -c``.
NAIVE = """
import sys
import lmdb
import numpy as np
from mnist2db.datum_pb2 import Datum

images_path, labels_path, out = sys.argv[1:4]
images = np.fromfile(images_path, dtype=np.uint8, offset=16)
labels = np.fromfile(labels_path, dtype=np.uint8, offset=8)
n = len(labels)
rows, cols = 28, 28
images = images.reshape(n, rows, cols)
env = lmdb.open(out, map_size=1 << 40)
txn = env.begin(write=True)
for i in range(n):
    datum = Datum()
    datum.channels = 1
    datum.height = rows
    datum.width = cols
    datum.data = images[i].tobytes()
    datum.label = int(labels[i])
    txn.put(b"%08d" % i, datum.SerializeToString())
    if (i + 1) % 1000 == 0:
        txn.commit()
        txn = env.begin(write=True)
txn.commit()
env.close()
"""

#: The floors: the same keys and values, precomputed (reading excluded from the timing),
#: written by py-lmdb in one putmulti(append=True) transaction or by plyvel in write
#: batches of 1000, then flushed as mnist2db flushes. Prints the seconds of the writing.
FLOOR = """
import os, sys, time
images_path, labels_path, out, backend = sys.argv[1:5]
with open(images_path, "rb") as f:
    f.seek(16)
    pixels = f.read()
with open(labels_path, "rb") as f:
    f.seek(8)
    labels = f.read()
size = 28 * 28
prefix = b"\\x08\\x01\\x10\\x1c\\x18\\x1c\\x22\\x90\\x06"
values = [prefix + pixels[i * size:(i + 1) * size] + b"\\x28" + labels[i:i + 1]
          for i in range(len(labels))]
keys = [b"%08d" % i for i in range(len(labels))]
start = time.perf_counter()
if backend == "lmdb":
    import lmdb
    env = lmdb.open(out, map_size=2 * len(values) * 1024 + (16 << 20), sync=False,
                    metasync=False, readahead=False, meminit=False)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(zip(keys, values), append=True)
    env.sync(True)
    env.close()
elif backend == "lmdb1000":
    import lmdb
    env = lmdb.open(out, map_size=2 * len(values) * 1024 + (16 << 20), sync=False,
                    metasync=False, readahead=False, meminit=False)
    for s in range(0, len(values), 1000):
        with env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(keys[s:s + 1000], values[s:s + 1000]), append=True)
    env.sync(True)
    env.close()
else:
    import plyvel
    db = plyvel.DB(out, create_if_missing=True, error_if_exists=True, block_size=65536,
                   write_buffer_size=268435456, max_open_files=100)
    for s in range(0, len(values), 1000):
        with db.write_batch() as batch:
            for k, v in zip(keys[s:s + 1000], values[s:s + 1000]):
                batch.put(k, v)
    db.write_batch(sync=True).write()
    db.close()
for name in os.listdir(out):
    fd = os.open(os.path.join(out, name), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
print(time.perf_counter() - start)
"""


#: ``mnist2db convert`` with the records' digest left out (its hash and framing; the file it
#: is written to stays): the digest row's yardstick, so its cost is seen when it grows.
NO_DIGEST = """
import sys
from mnist2db.storage import record_digest

class NoDigest(record_digest.RecordDigest):
    def add(self, items):
        self.count += len(items)

record_digest.RecordDigest = NoDigest  # before the pipeline imports it
from mnist2db.__main__ import script

sys.argv = ["mnist2db", *sys.argv[1:]]
sys.exit(script())
"""


@dataclass
class Contender:
    name: str
    dataset: str
    argv: list[str]  # {images} {labels} {out} are substituted
    records: int = 0
    floor: bool = False  # the time that counts is what the process prints
    size: int = 0  # bytes of the database written (the last run's)
    times: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # KiB
    anon: list[int] = field(default_factory=list)  # KiB, sampled

    def median_time(self) -> float:
        return statistics.median(self.times)

    def median_rss(self) -> float:
        return statistics.median(self.rss) / 1024

    def median_anon(self) -> float:
        return statistics.median(self.anon) / 1024 if self.anon else float("nan")


def run_once(argv: list[str], out: Path) -> tuple[float, int, int, str, int]:
    """Run one process; returns (wall seconds, peak RSS KiB, peak sampled RssAnon KiB, stdout,
    bytes of the files it wrote in ``out``)."""
    wall, _, rss, anon, stdout = reap(argv, out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else 0
    shutil.rmtree(out, ignore_errors=True)
    return wall, rss, anon, stdout, size


def measure(
    contenders: list[Contender], data: dict[str, tuple[Path, Path]], work: Path, repeat: int
) -> None:
    out = work / "out-db"
    for _ in range(repeat):
        for c in contenders:  # alternating: one run of each, then again
            images, labels = data[c.dataset]
            argv = [a.format(images=images, labels=labels, out=out) for a in c.argv]
            wall, rss, anon, stdout, size = run_once(argv, out)
            c.size = size
            c.times.append(float(stdout.strip()) if c.floor else wall)
            c.rss.append(rss)
            c.anon.append(anon)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each contender")
    parser.add_argument(
        "--scale",
        default="10000,100000,1000000",
        help="generated record counts for the scale series ('' for none)",
    )
    parser.add_argument("--scale-repeat", type=int, default=3)
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument(
        "--imageset-repeat", type=int, default=3, help="runs of each imageset contender (0: none)"
    )
    args = parser.parse_args()

    py = sys.executable
    m2d = str(BIN / "mnist2db")
    cmd = str(BIN / "convert_mnist_data")
    byte_compile()
    work = Path(tempfile.mkdtemp(prefix="mnist2db-bench-"))
    lines: list[str] = []
    try:
        data, source = gunzip_or_generate(work)
        counts = {k: (v[1].stat().st_size - 8) for k, v in data.items()}

        def convert(backend: str) -> list[str]:
            return [m2d, "convert", "-q", f"--backend={backend}", "{images}", "{labels}", "{out}"]

        contenders = [
            Contender(
                "naive Python converter, LMDB",
                "train",
                [py, "-c", NAIVE, "{images}", "{labels}", "{out}"],
            ),
            Contender("mnist2db convert, LMDB", "train", convert("lmdb")),
            Contender(DIGEST_OFF, "train", [py, "-c", NO_DIGEST, *convert("lmdb")[1:]]),
            Contender(
                "convert_mnist_data (mnist2db), LMDB",
                "train",
                [cmd, "{images}", "{labels}", "{out}"],
            ),
            Contender("mnist2db convert, LevelDB", "train", convert("leveldb")),
            Contender(
                "mnist2db convert --encoded png, LMDB",
                "train",
                [*convert("lmdb")[:3], "--encoded", "png", *convert("lmdb")[3:]],
            ),
            Contender(
                "mnist2db convert --encoded png --png-compression small, LMDB",
                "train",
                [
                    *convert("lmdb")[:3],
                    "--encoded",
                    "png",
                    "--png-compression",
                    "small",
                    *convert("lmdb")[3:],
                ],
            ),  # fmt: skip
            Contender(
                "convert_mnist_data (mnist2db), LevelDB",
                "train",
                [cmd, "--backend=leveldb", "{images}", "{labels}", "{out}"],
            ),
            Contender(
                "floor: py-lmdb putmulti(append), one txn",
                "train",
                [py, "-c", FLOOR, "{images}", "{labels}", "{out}", "lmdb"],
                floor=True,
            ),
            Contender(
                "floor: py-lmdb putmulti(append), txns of 1000",
                "train",
                [py, "-c", FLOOR, "{images}", "{labels}", "{out}", "lmdb1000"],
                floor=True,
            ),
            Contender(
                "floor: plyvel write batches of 1000",
                "train",
                [py, "-c", FLOOR, "{images}", "{labels}", "{out}", "leveldb"],
                floor=True,
            ),
            Contender(
                "naive Python converter, LMDB",
                "test",
                [py, "-c", NAIVE, "{images}", "{labels}", "{out}"],
            ),
            Contender("mnist2db convert, LMDB", "test", convert("lmdb")),
            Contender(
                "convert_mnist_data (mnist2db), LMDB",
                "test",
                [cmd, "{images}", "{labels}", "{out}"],
            ),
            Contender("mnist2db --help", "test", [m2d, "--help"]),
            Contender('python -c "import numpy"', "test", [py, "-c", "import numpy"]),
            Contender('python -c "import click"', "test", [py, "-c", "import click"]),
        ]
        print(f"data: {source}; {args.repeat} runs each, alternating ...", file=sys.stderr)
        measure(contenders, data, work, args.repeat)

        naive = {c.dataset: c.median_time() for c in contenders if c.name.startswith("naive")}
        lines += [
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
            f"data: {source}; medians of {args.repeat} alternating runs.",
            "",
            "| contender | set | wall s | × naive | peak RSS MB | RssAnon MB |",
            "|---|---|---|---|---|---|",
        ]
        for c in contenders:
            ratio = c.median_time() / naive[c.dataset]
            wall = f"{c.median_time():.3f}" + (" (write only)" if c.floor else "")
            lines.append(
                f"| {c.name} | {c.dataset} ({counts[c.dataset]}) | {wall} | {ratio:.2f}× "
                f"| {c.median_rss():.1f} | {c.median_anon():.1f} |"
            )

        by = {(c.name, c.dataset): c for c in contenders}
        scale_rows: list[tuple[int, Contender]] = []
        leveldb_rows: list[tuple[int, Contender]] = []
        for n in [int(x) for x in args.scale.split(",") if x.strip()]:
            print(f"scale: {n} records ...", file=sys.stderr)
            sdir = work / f"scale-{n}"
            sdir.mkdir()
            sdata = {"scale": generate(sdir, n, "scale")}
            c = Contender("mnist2db convert, LMDB", "scale", convert("lmdb"), records=n)
            ldb = Contender("mnist2db convert, LevelDB", "scale", convert("leveldb"), records=n)
            measure([c, ldb], sdata, work, args.scale_repeat)
            scale_rows.append((n, c))
            leveldb_rows.append((n, ldb))
            shutil.rmtree(sdir)
        train_lmdb = by[("mnist2db convert, LMDB", "train")]
        per_train = train_lmdb.median_time() / counts["train"]
        if scale_rows:
            lines += [
                "",
                "Scale series (generated 28 × 28 records, mnist2db convert, LMDB, "
                f"medians of {args.scale_repeat}):",
                "",
                "| records | wall s | µs / record | vs train set | peak RSS MB | RssAnon MB |",
                "|---|---|---|---|---|---|",
            ]
            for n, c in scale_rows:
                per = c.median_time() / n
                lines.append(
                    f"| {n} | {c.median_time():.3f} | {per * 1e6:.2f} | {per / per_train:.2f}× "
                    f"| {c.median_rss():.1f} | {c.median_anon():.1f} |"
                )
            lines += [
                "",
                "The same records written as LevelDB (memory bounded at any size), "
                "alternating with the LMDB runs:",
                "",
                "| records | wall s | µs / record | × LMDB same size | peak RSS MB | RssAnon MB |",
                "|---|---|---|---|---|---|",
            ]
            for (n, c), (_, lmdb_c) in zip(leveldb_rows, scale_rows, strict=True):
                per = c.median_time() / n
                lines.append(
                    f"| {n} | {c.median_time():.3f} | {per * 1e6:.2f} "
                    f"| {c.median_time() / lmdb_c.median_time():.2f}× "
                    f"| {c.median_rss():.1f} | {c.median_anon():.1f} |"
                )

        lines += ["", *digest_table(by)]
        lines += ["", *png_write_table(by, counts["train"])]
        lines += ["", "Targets (conversion, same run):", ""]
        lines += targets(by, naive, scale_rows, per_train)

        print("read side ...", file=sys.stderr)
        lines += ["", *read_table(*data["train"], work)]
        png_lines, png_rates = png_read_table(*data["test"], work)
        lines += ["", *png_lines]
        lines += ["", "Targets (PNG records, LevelDB, reading; same run):", ""]
        lines += targets_19(by, leveldb_rows, png_rates)

        print("export ...", file=sys.stderr)
        lines += ["", *export_table(*data["train"], work, repeat=3)]
        if args.imageset_repeat > 0:
            print("your own images ...", file=sys.stderr)
            lines += ["", *imageset_table(args.imageset_repeat)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def targets(
    by: dict[tuple[str, str], Contender],
    naive: dict[str, float],
    scale_rows: list[tuple[int, Contender]],
    per_train: float,
) -> list[str]:
    def row(what: str, value: str, ok: bool) -> str:
        return f"| {what} | {value} | {'met' if ok else 'MISSED'} |"

    lmdb_train = by[("mnist2db convert, LMDB", "train")].median_time() / naive["train"]
    lmdb_test = by[("mnist2db convert, LMDB", "test")].median_time() / naive["test"]
    ldb = by[("mnist2db convert, LevelDB", "train")].median_time()
    ldb_floor = by[("floor: plyvel write batches of 1000", "train")].median_time()
    rss = by[("mnist2db convert, LMDB", "train")].median_rss()
    helptime = by[("mnist2db --help", "test")].median_time()
    out = [
        "| target | measured | |",
        "|---|---|---|",
        row(
            "1. LMDB train ≤ 0.33× naive (stretch 0.25×)", f"{lmdb_train:.2f}×", lmdb_train <= 0.33
        ),
        row("2. LMDB test ≤ 0.42× naive", f"{lmdb_test:.2f}×", lmdb_test <= 0.42),
        row("3. LevelDB train ≤ 0.35 s", f"{ldb:.3f} s", ldb <= 0.35),
        row(
            "3. LevelDB train ≤ 1.3× floor (floor: write only)",
            f"{ldb / ldb_floor:.2f}×",
            ldb / ldb_floor <= 1.3,
        ),
        row("4. LMDB train peak RSS ≤ 35 MB", f"{rss:.1f} MB", rss <= 35),
    ]
    big = [c for n, c in scale_rows if n >= 1_000_000]
    if big:
        anon = big[0].median_anon()
        per = big[0].median_time() / big[0].records
        out.append(
            row("4. RssAnon at 1 000 000 records ≤ 30 MB (sampled)", f"{anon:.1f} MB", anon <= 30)
        )
        out.append(
            row(
                "5. time/record at 1 000 000 ≤ 1.2× train set",
                f"{per / per_train:.2f}×",
                per / per_train <= 1.2,
            )
        )
    out.append(row("6. mnist2db --help ≤ 0.06 s", f"{helptime:.3f} s", helptime <= 0.06))
    return out


#: The contender without the records' digest (:data:`NO_DIGEST`).
DIGEST_OFF = "mnist2db convert, LMDB, without the records' digest"


def digest_table(by: dict[tuple[str, str], Contender]) -> list[str]:
    """What the records' digest costs a conversion: with it against without it."""
    on, off = by[("mnist2db convert, LMDB", "train")], by[(DIGEST_OFF, "train")]
    return [
        "The records' digest (sha256 of every record, written into mnist2db.json), same run:",
        "",
        "| convert, LMDB, train | wall s | peak RSS MB |",
        "|---|---|---|",
        f"| with the digest | {on.median_time():.3f} | {on.median_rss():.1f} |",
        f"| without it | {off.median_time():.3f} | {off.median_rss():.1f} |",
        f"| digest's cost | {on.median_time() / off.median_time():.2f}× | |",
    ]


#: The PNG compressions' contenders (docs/performance.md, "Writing PNG records").
PNG_WRITERS = {
    "fast": "mnist2db convert --encoded png, LMDB",
    "small": "mnist2db convert --encoded png --png-compression small, LMDB",
}


def png_write_table(by: dict[tuple[str, str], Contender], records: int) -> list[str]:
    """Writing PNG records, each compression against the raw conversion of the same run."""
    raw = by[("mnist2db convert, LMDB", "train")]
    out = [
        "Writing PNG records (train set), against the raw LMDB conversion of the same run:",
        "",
        "| --png-compression | wall s | × raw conversion | µs / record more than raw "
        "| database bytes | × raw database |",
        "|---|---|---|---|---|---|",
    ]
    for name, contender in PNG_WRITERS.items():
        png = by[(contender, "train")]
        more = (png.median_time() - raw.median_time()) / records * 1e6
        out.append(
            f"| {name} | {png.median_time():.3f} | {png.median_time() / raw.median_time():.2f}× "
            f"| {more:.2f} | {png.size} | {png.size / raw.size:.3f}× |"
        )
    return out


def targets_19(
    by: dict[tuple[str, str], Contender],
    leveldb_rows: list[tuple[int, Contender]],
    png_rates: dict[str, float],
) -> list[str]:
    def row(what: str, value: str, ok: bool) -> str:
        return f"| {what} | {value} | {'met' if ok else 'MISSED'} |"

    raw = by[("mnist2db convert, LMDB", "train")]
    fast = by[(PNG_WRITERS["fast"], "train")]
    small = by[(PNG_WRITERS["small"], "train")]
    ldb = by[("mnist2db convert, LevelDB", "train")]
    write = fast.median_time() / raw.median_time()
    ldb_ratio = ldb.median_time() / raw.median_time()
    out = [
        "| target | measured | |",
        "|---|---|---|",
        row(
            "convert --encoded png (fast, the default), train ≤ 7× the raw conversion",
            f"{write:.2f}×",
            write <= 7,
        ),
    ]
    # The size bound holds for zlib's compression only: fast trades ~12% for its speed.
    for name, png in (("fast", fast), ("small", small)):
        size = png.size / raw.size
        out.append(row(f"PNG database ({name}) ≤ 0.75× the raw one", f"{size:.2f}×", size <= 0.75))
    out.append(
        row("LevelDB convert, train ≤ 1.7× the LMDB one", f"{ldb_ratio:.2f}×", ldb_ratio <= 1.7)
    )
    big = [c for n, c in leveldb_rows if n >= 1_000_000]
    if big:
        rss = big[0].median_rss()
        out.append(
            row("LevelDB at 1 000 000 records: peak RSS ≤ 150 MiB", f"{rss:.0f} MB", rss <= 150)
        )
    if "dali" in png_rates:
        single = png_rates["db[i]"] / png_rates["dali"]
        batch = png_rates["getitems"] / png_rates["dali"]
        out.append(
            row("PNG open_db[i] ≥ 1.5× DALI's CPU pipeline", f"{single:.2f}×", single >= 1.5)
        )
        out.append(row("PNG __getitems__ of 500 ≥ 2× DALI", f"{batch:.2f}×", batch >= 2))
    else:
        out.append("| PNG reads against DALI | DALI not installed (make test-dali) | |")
    return out


if __name__ == "__main__":
    main()
