"""A standard output that cannot be written (`> /dev/full`) ends in one line and exit 1, not
an OSError traceback; a closed pipe (`| head`) ends quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx

from mnist2db import convert


@pytest.fixture
def db(tmp_path: Path) -> Path:
    # 300 digits of 28 × 28 draw as about 500 kB of text: more than a pipe holds.
    images = write_idx(tmp_path / "i", make_images(300))
    labels = write_idx(tmp_path / "l", make_labels(300))
    out = tmp_path / "db"
    convert(images, labels, out)
    return out


@pytest.mark.parametrize("command", [["show"], ["show", "--ascii"], ["info"], ["mean"]])
def test_a_full_standard_output_is_one_line(db: Path, command: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "mnist2db", command[0], str(db), *command[1:]],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert (done.returncode, done.stderr) == (
        1,
        "Error: cannot write to standard output: No space left on device\n",
    )


def test_a_closed_pipe_ends_quietly(db: Path) -> None:
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db", "show", str(db), "--count", "300"],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert reader.communicate(timeout=30)[0] == b"#0  key 00"
    assert (done.returncode, done.stderr) == (1, "")
