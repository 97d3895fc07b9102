"""The start-up budget of the fast paths, kept by this one test (see mnist2db/startup.py).

A plain ``mnist2db convert`` and Caffe's drop-in ``convert_mnist_data`` run in a fresh
interpreter; afterwards none of the modules whose import would cost a visible share of a
conversion may be loaded. Speed itself belongs in ``make bench``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import write_idx

#: Imported by none of the fast paths (each costs 5-80 ms of start-up; README, Performance).
BANNED = ("click", "numpy", "typing", "dataclasses", "tempfile", "ctypes.util", "google.protobuf")

RUN = """
import sys
sys.argv = [{argv0!r}, *{args!r}]
from {module} import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(code, sorted(m for m in {banned!r} if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("module", "argv0", "first"),
    [
        ("mnist2db.__main__", "mnist2db", ["convert"]),
        ("mnist2db.__main__", "mnist2db", ["convert", "--backend", "leveldb", "-q"]),
        ("mnist2db.caffe_tools.drop_ins", "convert_mnist_data", []),
    ],
)
def test_a_plain_conversion_imports_nothing_heavy(
    tmp_path: Path, module: str, argv0: str, first: list[str]
) -> None:
    rng = np.random.default_rng(5)
    images = write_idx(tmp_path / "images", rng.integers(0, 256, (30, 4, 5), dtype=np.uint8))
    labels = write_idx(tmp_path / "labels", rng.integers(0, 10, 30, dtype=np.uint8))
    args = [*first, str(images), str(labels), str(tmp_path / "db")]
    code = RUN.format(argv0=argv0, args=args, module=module, banned=BANNED)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 []", done.stderr
    assert (tmp_path / "db").is_dir()
