"""The line each front end logs on its decoders (mnist2db.formats.imread.cv2_wheel.decoder_note): OpenCV's
wheel with its version, or the pure path and why, in real processes of both front ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mnist2db.formats.imread.cv2_wheel import NO_OPENCV

#: Each front end's entry point, run as ``python -c``; a first line may hide OpenCV's wheel.
FRONT_ENDS = {
    "imageset": "from mnist2db.__main__ import script; script()",
    "convert_imageset": "from mnist2db.caffe_tools.convert_imageset import script; script()",
}
HIDE_OPENCV = "import sys; sys.modules['cv2'] = None  # import cv2 fails, as where not installed\n"


def _photos(tmp_path: Path) -> tuple[str, str]:
    root = tmp_path / "photos"
    root.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(root / f"{i}.jpg")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{i}.jpg {i}\n" for i in range(3)))
    return str(root) + "/", str(listing)


def _run(tmp_path: Path, front_end: str, env: dict[str, str], hide: bool = False) -> list[str]:
    root, listing = _photos(tmp_path)
    out = str(tmp_path / "db")
    args = (
        ["imageset", "--list", listing, "--resize", "16x16", root, out]
        if front_end == "imageset"
        else ["--resize_width=16", "--resize_height=16", root, listing, out]
    )
    code = (HIDE_OPENCV if hide else "") + FRONT_ENDS[front_end]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert os.path.isdir(out)
    return [line.rsplit("] ", 1)[-1] for line in done.stderr.splitlines() if "decoding" in line]


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != NO_OPENCV}
    return {**env, **extra}


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_the_run_names_opencv_and_its_version(tmp_path: Path, front_end: str) -> None:
    cv2 = pytest.importorskip("cv2")
    lines = _run(tmp_path, front_end, _environment())
    assert len(lines) == 1
    assert lines[0].startswith(f"decoding with OpenCV {cv2.__version__}")
    assert lines[0].endswith(" (cv2)")


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_the_run_names_the_pure_path_the_variable_chose(tmp_path: Path, front_end: str) -> None:
    lines = _run(tmp_path, front_end, _environment(**{NO_OPENCV: "1"}))
    assert lines == [f"decoding with Pillow and numpy ({NO_OPENCV}=1)"]


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_the_run_names_the_pure_path_without_opencv(tmp_path: Path, front_end: str) -> None:
    lines = _run(tmp_path, front_end, _environment(), hide=True)
    assert lines == ["decoding with Pillow and numpy (OpenCV not installed)"]


def test_quiet_keeps_the_line_back(tmp_path: Path) -> None:
    root, listing = _photos(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", FRONT_ENDS["imageset"], "imageset", "--quiet", "--list", listing,
         root, str(tmp_path / "db")],
        capture_output=True, text=True, env=_environment(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "decoding" not in done.stderr
