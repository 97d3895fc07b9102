"""The imageset's parent loads numpy without OpenBLAS's thread pool (its threads spin as they
start, on the cores the workers decode on), and leaves the environment as it was."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import os
from mnist2db.process_setup import keep_the_heap, one_blas_thread, PARENT_HEAP
assert "numpy" not in __import__("sys").modules
with one_blas_thread():
    import numpy
print(len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS"))
keep_the_heap(PARENT_HEAP)
keep_the_heap(None)
"""


def test_numpy_loads_without_blas_threads() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    threads, variable = done.stdout.split()
    assert threads == "1"  # without the block: one per core beside the main thread
    assert variable == "None"
