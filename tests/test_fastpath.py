"""The fast paths, kept by this one test (see mnist2db/fastpath.py).

A plain ``mnist2db convert`` and Caffe's drop-in ``convert_mnist_data`` run in a fresh
interpreter; afterwards no mnist2db module outside :data:`mnist2db.fastpath.FAST_PATH` and
none of the modules whose import would cost a visible share of a conversion may be loaded;
together the runs load every module the set names (so the set stays exact). ``mnist2db
--help`` loads click and the group alone. Speed itself belongs in ``make bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import write_idx

from mnist2db.fastpath import FAST_PATH, IMAGESET_PATH

#: Imported by none of the fast paths (each costs 5-80 ms of start-up; docs, Performance).
BANNED = ("click", "numpy", "typing", "dataclasses", "tempfile", "ctypes.util", "google.protobuf")

RUN = """
import json, sys
sys.argv = [{argv0!r}, *{args!r}]
from {module} import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(m for m in {banned!r} if m in sys.modules),
                  sorted(m for m in sys.modules if m.split(".")[0] == "mnist2db")]))
"""

RUNS = [
    ("mnist2db.__main__", "mnist2db", ["convert"]),
    ("mnist2db.__main__", "mnist2db", ["convert", "--backend", "leveldb", "-q"]),
    ("mnist2db.caffe_tools.drop_ins", "convert_mnist_data", []),
]


def run_fresh(
    tmp_path: Path, module: str, argv0: str, args: list[str], banned: tuple[str, ...] = BANNED
) -> tuple[int, list, list]:
    code = RUN.format(argv0=argv0, args=args, module=module, banned=banned)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    exit_code, banned, loaded = json.loads(done.stdout.splitlines()[-1])
    return exit_code, banned, loaded


def conversion_args(tmp_path: Path, first: list[str]) -> list[str]:
    rng = np.random.default_rng(5)
    images = write_idx(tmp_path / "images", rng.integers(0, 256, (30, 4, 5), dtype=np.uint8))
    labels = write_idx(tmp_path / "labels", rng.integers(0, 10, 30, dtype=np.uint8))
    return [*first, str(images), str(labels), str(tmp_path / "db")]


@pytest.mark.parametrize(("module", "argv0", "first"), RUNS)
def test_a_plain_conversion_stays_on_the_fast_path(
    tmp_path: Path, module: str, argv0: str, first: list[str]
) -> None:
    exit_code, banned, loaded = run_fresh(tmp_path, module, argv0, conversion_args(tmp_path, first))
    assert (exit_code, banned) == (0, [])
    assert sorted(set(loaded) - FAST_PATH) == []
    assert (tmp_path / "db").is_dir()


def test_the_fast_path_set_names_only_what_the_runs_load(tmp_path: Path) -> None:
    seen: set[str] = set()
    for i, (module, argv0, first) in enumerate(RUNS):
        (tmp_path / str(i)).mkdir()
        seen.update(
            run_fresh(tmp_path, module, argv0, conversion_args(tmp_path / str(i), first))[2]
        )
    assert sorted(FAST_PATH - seen) == []


def test_group_help_loads_click_and_the_group_alone(tmp_path: Path) -> None:
    exit_code, banned, loaded = run_fresh(tmp_path, "mnist2db.cli.app", "mnist2db", ["--help"])
    assert exit_code == 0
    assert set(banned) <= {"click", "typing"}  # click's own imports
    # mnist2db.version: the ground-floor module --version reads (not the public face)
    assert loaded == ["mnist2db", "mnist2db.cli", "mnist2db.cli.app", "mnist2db.fastpath",
                      "mnist2db.interrupt", "mnist2db.version"]  # fmt: skip


#: What convert_imageset's own process loads for none of a list of PNGs: tempfile is
#: multiprocessing's own import (its pipes); Pillow's core is loaded by the workers.
IMAGESET_BANNED = ("click", "numpy", "typing", "dataclasses", "google.protobuf", "PIL", "cv2")


def test_a_list_of_pngs_stays_on_the_imageset_path(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(root / f"{i}.png")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{i}.png {i}\n" for i in range(3)))
    args = ["-j", "1", f"{root}/", str(listing), str(tmp_path / "db")]
    module = "mnist2db.caffe_tools.convert_imageset"
    exit_code, banned, loaded = run_fresh(tmp_path, module, "convert_imageset", args,
                                          IMAGESET_BANNED)  # fmt: skip
    assert (exit_code, banned) == (0, [])
    assert sorted(set(loaded) - FAST_PATH - IMAGESET_PATH) == []
    assert sorted(IMAGESET_PATH - set(loaded)) == []
    assert (tmp_path / "db" / "data.mdb").is_file()


@pytest.mark.parametrize("flags", [["--resize_height=8", "--resize_width=6"], ["--encoded"], []])
def test_a_list_of_photos_loads_no_decoder_in_the_parent(tmp_path: Path, flags: list[str]) -> None:
    """JPEGs: the workers load numpy, Pillow and OpenCV themselves, after the fork (so they
    fork sooner and load them in parallel); the parent, which never decodes, loads none."""
    from PIL import Image

    from mnist2db.storage.readers import iter_db

    root = tmp_path / "images"
    root.mkdir()
    rng = np.random.default_rng(4)
    for i in range(4):
        pixels = rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.jpg", quality=90)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{i}.jpg {i}\n" for i in range(4)))
    args = [*flags, "-j", "2", f"{root}/", str(listing), str(tmp_path / "db")]
    module = "mnist2db.caffe_tools.convert_imageset"
    exit_code, banned, loaded = run_fresh(tmp_path, module, "convert_imageset", args,
                                          IMAGESET_BANNED)  # fmt: skip
    assert (exit_code, banned) == (0, [])
    assert sorted(set(loaded) - FAST_PATH - IMAGESET_PATH) == []
    keys = [key for key, _ in iter_db(str(tmp_path / "db"), "lmdb")]
    assert keys == [f"{i:08d}_{i}.jpg".encode() for i in range(4)]
