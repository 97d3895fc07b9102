"""Many workers in bounded memory: above a few, the decoders are loaded once before the
fork and their pages shared (mnist2db.imageset.to_database.shared_decoders), and the
default stops at eight workers (mnist2db.imageset.workers.pool.default_jobs). A real
``convert_imageset`` with 24 workers, its processes' proportional sets summed as it runs;
the records the same as with one worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mnist2db.imageset.to_database import SHARED_DECODERS_ABOVE, shared_decoders
from mnist2db.imageset.workers import pool as workers
from mnist2db.imageset.workers.pool import default_jobs
from mnist2db.storage.databases.readers import iter_db

#: The issue's bound on the memory of all the run's processes together.
BOUND_MIB = 256


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


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def _run(args: list[str]) -> tuple[int, int, str]:
    """(exit code, peak PSS KiB summed over the process and its workers, stderr)."""
    argv = [sys.executable, "-m", "mnist2db.caffe_tools.convert_imageset", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(_pss_kib(p) for p in _tree(proc.pid)))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    return proc.returncode, peak[0], err.decode()


def test_more_than_a_few_workers_share_the_decoders() -> None:
    assert not shared_decoders(SHARED_DECODERS_ABOVE)
    assert shared_decoders(SHARED_DECODERS_ABOVE + 1)


@pytest.mark.parametrize(("cores", "jobs"), [(1, 1), (2, 2), (8, 8), (64, 8), (0, 1)])
def test_the_default_is_one_worker_a_core_up_to_eight(
    monkeypatch: pytest.MonkeyPatch, cores: int, jobs: int
) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _: set(range(cores)), raising=False)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: cores or None)
    assert default_jobs() == jobs


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux's PSS")
def test_24_workers_stay_within_the_bound_and_write_what_one_writes(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(12)
    for i in range(48):
        pixels = rng.integers(0, 256, (60 + i, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.jpg", quality=85)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{i}.jpg {i % 5}\n" for i in range(48)))
    flags = ["--resize_height=40", "--resize_width=30"]
    dbs = {}
    for jobs in (1, 24):
        out = tmp_path / f"db{jobs}"
        code, peak, err = _run([*flags, f"-j={jobs}", f"{root}/", str(listing), str(out)])
        assert code == 0, err
        dbs[jobs] = list(iter_db(str(out), "lmdb"))
        if jobs == 24:
            # Each worker loading numpy and OpenCV itself: 400-450 MiB of PSS in all here;
            # sharing them, ~100.
            assert 0 < peak < BOUND_MIB << 10, f"peak PSS {peak >> 10} MiB"
    assert len(dbs[1]) == 48 and dbs[24] == dbs[1]
