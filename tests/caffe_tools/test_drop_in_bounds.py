"""The drop-ins' command lines, bounded and round-tripping: every seed
convert_mnist_siamese_data reports is accepted back, and a flagfile is a bounded
regular file, never a FIFO or a device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from db_helpers import record_digest
from helpers import make_images, make_labels, write_idx

from mnist2db.caffe_tools.gflags import FLAGFILE_LIMIT
from mnist2db.siamese import convert_siamese

SIAMESE_TOOL = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import siamese_main; siamese_main()",
]
CONVERT_TOOL = [sys.executable, "-c", "from mnist2db.caffe_tools.drop_ins import main; main()"]
MEAN_TOOL = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import mean_main; mean_main()",
]


def _run(argv: list[object], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_idx(tmp_path / "i", make_images(20, 3, 3)),
        write_idx(tmp_path / "l", make_labels(20)),
    )


@pytest.mark.parametrize("seed", [2**63, 2**64 - 1, 0x8000_0000_0000_0001])
def test_the_upper_half_of_the_seeds_is_accepted(
    pair: tuple[Path, Path], tmp_path: Path, seed: int
) -> None:
    """Fresh seeds are drawn from 0 … 2**64-1; the int64 flag refused half of them."""
    out = tmp_path / "pairs"
    done = _run([*SIAMESE_TOOL, *pair, out, f"--seed={seed}", "--logtostderr"])
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].endswith(f"same-class), seed {seed}.")
    convert_siamese(*pair, tmp_path / "same", seed=seed)
    assert record_digest(out) == record_digest(tmp_path / "same")


def test_a_reported_fresh_seed_gives_the_same_pairs_again(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    for attempt in range(8):  # half the fresh seeds are above 2**63: eight runs miss one 1 in 256
        first = tmp_path / f"fresh{attempt}"
        done = _run([*SIAMESE_TOOL, *pair, first, "--logtostderr"])
        assert done.returncode == 0, done.stderr
        seed = int(done.stderr.splitlines()[-1].rsplit("seed ", 1)[1].rstrip("."))
        again = tmp_path / f"again{attempt}"
        repeated = _run([*SIAMESE_TOOL, *pair, again, f"--seed={seed}"])
        assert repeated.returncode == 0, repeated.stderr
        assert record_digest(again) == record_digest(first)


@pytest.mark.parametrize("value", ["18446744073709551616", "-9223372036854775809"])
def test_seeds_outside_64_bits_are_still_illegal(pair: tuple[Path, Path], value: str) -> None:
    done = _run([*SIAMESE_TOOL, *pair, "x", f"--seed={value}"])
    assert (done.returncode, done.stderr) == (
        1,
        f"ERROR: illegal value '{value}' specified for int64 flag 'seed'\n",
    )


def test_a_negative_seed_other_than_minus_one_is_one_line(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    done = _run([*SIAMESE_TOOL, *pair, tmp_path / "x", "--seed=-5", "--logtostderr"])
    assert done.returncode == 1
    assert done.stderr.rstrip().split("] ", 1)[1] == "seed must be between 0 and 2**64-1, got -5"
    assert not (tmp_path / "x").exists()


# -- flagfiles ----------------------------------------------------------------------------------


def _hostile_flagfiles(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "zero").symlink_to("/dev/zero")
    big = tmp_path / "big"
    big.write_bytes(b"#" * (FLAGFILE_LIMIT + 1))
    not_regular = "not a regular file; a flagfile is a text file of --flag=value lines"
    return {
        "device": (Path("/dev/zero"), not_regular),
        "link to a device": (tmp_path / "zero", not_regular),
        "fifo": (fifo, not_regular),
        "directory": (tmp_path, "a directory; a flagfile is a text file of --flag=value lines"),
        "too large": (
            big,
            f"larger than {FLAGFILE_LIMIT} bytes; a flagfile is a few --flag=value lines",
        ),
    }


@pytest.mark.parametrize("tool", [CONVERT_TOOL, MEAN_TOOL, SIAMESE_TOOL])
def test_a_flagfile_is_a_bounded_regular_file(tmp_path: Path, tool: list[str]) -> None:
    """--flagfile=/dev/zero read until MemoryError; a FIFO waited forever."""
    for name, (path, reason) in _hostile_flagfiles(tmp_path).items():
        done = _run([*tool, f"--flagfile={path}", "a", "b", "c"], timeout=30)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"{path}: {reason}\n"), name


def test_a_flagfile_at_the_limit_is_read(pair: tuple[Path, Path], tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    line = b"--backend=lmdb\n"
    flags.write_bytes(line + b"#" * (FLAGFILE_LIMIT - len(line) - 1) + b"\n")
    assert flags.stat().st_size == FLAGFILE_LIMIT
    done = _run([*CONVERT_TOOL, f"--flagfile={flags}", *pair, tmp_path / "db"])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "db" / "data.mdb").is_file()


def test_flagfiles_nested_without_end_are_one_line(tmp_path: Path) -> None:
    """A chain of 1500 flagfiles ended in Python's RecursionError traceback."""
    for i in range(1500):
        (tmp_path / f"f{i}").write_text(f"--flagfile={tmp_path / f'f{i + 1}'}\n")
    (tmp_path / "f1500").write_text("--backend=lmdb\n")
    done = _run([*CONVERT_TOOL, f"--flagfile={tmp_path / 'f0'}", "a", "b", "c"])
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"ERROR: flagfile '{tmp_path / 'f64'}': flagfiles nested more than 64 deep\n"
    )
