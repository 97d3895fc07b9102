"""``mnist2db`` / ``python -m mnist2db``: the installed entry point runs the click command
(output, messages, exit codes, records, memory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from db_helpers import record_digest
from helpers import write_idx

#: The entry point as the installed ``mnist2db`` script runs it.
LAUNCH = "from mnist2db.__main__ import script; script()"


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, cwd=cwd
    )


def test_the_script_converts(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(30)
    done = run_script(["convert", str(ipath), str(lpath), "db"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line.rsplit(" in ", 1)[0] for line in done.stderr.splitlines()]
    assert lines[0] == "A total of 30 items."
    assert lines[-1] == "Wrote db (lmdb)"
    assert record_digest(tmp_path / "db")


@pytest.mark.parametrize(
    ("args", "code", "first_line"),
    [
        (["convert", "-q", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (["convert", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (
            ["convert", "--batch-size", "0", "a", "b", "db"],
            2,
            "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB",
        ),
        (["convert", "a", "b"], 2, "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB"),
    ],
)
def test_script_errors(tmp_path: Path, args: list[str], code: int, first_line: str) -> None:
    done = run_script(args, tmp_path)
    assert done.returncode == code
    assert done.stderr.splitlines()[0] == first_line


def test_the_script_refuses_an_existing_output(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(3)
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "notes.txt").write_text("mine")
    done = run_script(["convert", "-q", str(ipath), str(lpath), "db"], tmp_path)
    assert done.returncode == 1
    assert done.stderr == "Error: db: already exists (use --overwrite to replace it)\n"
    assert (tmp_path / "db" / "notes.txt").read_text() == "mine"


# -- memory -------------------------------------------------------------------------------


#: Spawns argv[1:] and prints its peak RSS. Linux counts the spawning process's memory in
#: the child's ru_maxrss (exec records the old address space's high-water mark), so the
#: child is spawned from this bare interpreter rather than from pytest.
REAPER = (
    "import os, sys\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def peak_rss_kib(argv: list[str]) -> int:
    result = subprocess.run(
        [sys.executable, "-c", REAPER, *argv], capture_output=True, text=True, check=True
    )
    code, peak = result.stdout.split()[-2:]
    assert code == "0", result
    return int(peak)


def test_memory_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    """Ten times the records (31 MB more pixels) adds only a few MB of peak RSS.

    A converter holding the dataset (or all its values) would add at least the 31 MB.
    """
    peaks = {}
    for count in (4000, 40000):
        rng = np.random.default_rng(count)
        images = write_idx(
            tmp_path / f"img{count}", rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        )
        labels = write_idx(tmp_path / f"lab{count}", rng.integers(0, 10, count, dtype=np.uint8))
        peaks[count] = peak_rss_kib(
            [
                sys.executable,
                "-c",
                LAUNCH,
                "convert",
                "-q",
                str(images),
                str(labels),
                str(tmp_path / f"db{count}"),
            ]
        )
    assert peaks[40000] - peaks[4000] < 12 * 1024, peaks


def test_the_script_prints_a_non_utf8_path_as_its_bytes(mnist_pair, tmp_path: Path) -> None:
    """The summary names a database whose name is not UTF-8 by its bytes spelled out
    (\\xe9), never a surrogate (\\udce9)."""
    ipath, lpath, _, _ = mnist_pair(3)
    out = os.fsdecode(b"caf\xe9_db")
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, "convert", str(ipath), str(lpath), out],
        capture_output=True,
        cwd=tmp_path,
        check=True,
    )
    assert done.stderr.decode().splitlines()[-1].rsplit(" in ", 1)[0] == r"Wrote caf\xe9_db (lmdb)"
    assert os.path.isdir(os.path.join(os.fsencode(tmp_path), b"caf\xe9_db"))
