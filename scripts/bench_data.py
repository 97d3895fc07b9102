"""The benchmark's inputs, shared by scripts/bench.py and scripts/bench_read.py: Debian's
Fashion-MNIST gunzipped into a work directory, else generated records of the same shape."""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

FASHION = Path("/usr/share/datasets/fashion-mnist")


def gunzip_or_generate(work: Path) -> tuple[dict[str, tuple[Path, Path]], str]:
    data: dict[str, tuple[Path, Path]] = {}
    if all((FASHION / f"{n}.gz").exists() for n in _names("train") + _names("t10k")):
        for stem in ("train", "t10k"):
            paths = []
            for name in _names(stem):
                target = work / name
                with gzip.open(FASHION / f"{name}.gz") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                paths.append(target)
            data["train" if stem == "train" else "test"] = (paths[0], paths[1])
        return data, f"Debian's Fashion-MNIST ({FASHION}, gunzipped first)"
    data["train"] = generate(work, 60000, "train")
    data["test"] = generate(work, 10000, "test")
    return data, "generated 60 000 + 10 000 records (Fashion-MNIST not installed)"


def byte_compile() -> None:
    """Byte-compile the package as pip does on install. Without it (an editable install with
    PYTHONDONTWRITEBYTECODE set, as on this project's machines) every measured process would
    compile mnist2db's ~60 modules anew: ~0.1 s of each run's start-up that no installed
    copy pays."""
    import mnist2db

    package = str(Path(mnist2db.__file__).parent)
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True)


def _names(stem: str) -> list[str]:
    return [f"{stem}-images-idx3-ubyte", f"{stem}-labels-idx1-ubyte"]


def generate(work: Path, count: int, stem: str) -> tuple[Path, Path]:
    """Random 28 × 28 images and 0-9 labels, written a chunk at a time."""
    images, labels = work / f"{stem}-images-idx3-ubyte", work / f"{stem}-labels-idx1-ubyte"
    rng = random.Random(count)
    with open(images, "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + count.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2)
        left = count
        while left:
            n = min(left, 10000)
            f.write(os.urandom(n * 784))
            left -= n
    with open(labels, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + count.to_bytes(4, "big"))
        f.write(bytes(rng.randrange(10) for _ in range(count)))
    return images, labels


#: Runs one contender and writes "wall_seconds cpu_seconds peak_rss_kib peak_rss_anon_kib" to
#: argv[1] (CPU: user + system of the process and the children it waited for). A separate
#: small process spawns it because Linux counts the spawning process's memory in the child's
#: ru_maxrss (exec records the old address space's high-water mark): spawned from a bench
#: script or from pytest, every child would "peak" at their size. This reaper is a bare
#: interpreter (~9 MB), below every contender.
REAPER = """
import os, sys, threading, time
report, argv = sys.argv[1], sys.argv[2:]
anon = [0]
done = threading.Event()
def sample(pid):
    path = f"/proc/{pid}/status"
    while not done.is_set():
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        anon[0] = max(anon[0], int(line.split()[1]))
                        break
        except OSError:
            return
        time.sleep(0.002)
start = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
sampler = threading.Thread(target=sample, args=(pid,), daemon=True)
sampler.start()
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
done.set()
with open(report, "w") as f:
    f.write(f"{wall} {usage.ru_utime + usage.ru_stime} {usage.ru_maxrss} {anon[0]}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


#: The memory :func:`warm_memory` touches before each run, at most (and at most half of what
#: the system has available): more than any contender writes (~2.1 GB, the export's large
#: database).
WARM = 4 << 30


def warm_memory() -> None:
    """Have the pages the next run's writes will take already touched once. In a virtual
    machine a page the guest has never touched costs the host's allocation at its first use:
    ``cat`` of 2 GB into a file took 5.1 s into such memory and 0.6-0.7 s into memory freed
    by an earlier run (measured here, 24 GB guest). Which contender got fresh memory
    depended on the order (the run after a tree set aside did), so ``cat`` read 3 times
    slower than ``cat`` then ``sync``. Populating an anonymous mapping and unmapping it
    leaves that many touched pages free for the next run (~1 s for 4 GiB once touched)."""
    import mmap

    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            available = next(int(line.split()[1]) << 10 for line in meminfo
                             if line.startswith("MemAvailable:"))  # fmt: skip
    except (OSError, StopIteration, ValueError):
        return
    size = min(WARM, available // 2) & ~(mmap.PAGESIZE - 1)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    with contextlib.suppress(OSError, ValueError):
        mmap.mmap(-1, size, flags=flags).close()


def reap(argv: list[str], out: Path) -> tuple[float, float, int, int, str]:
    """Run one process through :data:`REAPER`, ``out`` (its output) removed before and after;
    returns (wall s, CPU s, peak RSS KiB, peak sampled RssAnon KiB, its stdout)."""
    if out.exists():
        shutil.rmtree(out)
    warm_memory()
    # Start every run with no dirty data waiting for the disk (the previous run's deleted
    # output, a freshly generated input), so no run pays for another's writeback.
    os.sync()
    report = out.with_name("report.txt")
    proc = subprocess.run(
        [sys.executable, "-c", REAPER, str(report), *argv], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    wall, cpu, rss, anon = report.read_text().split()
    return float(wall), float(cpu), int(rss), int(anon), proc.stdout
