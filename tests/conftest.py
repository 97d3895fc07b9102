"""Shared fixtures (the helpers they use are in helpers.py: IDX files and data; db_helpers.py:
databases; os_helpers.py: mounts and processes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import make_images, make_labels, write_idx


def _separate_stderr_on_click_8_1() -> None:
    """The tests read ``result.stdout`` and ``result.stderr`` apart, as click >= 8.2's
    CliRunner always does; click 8.1 (the declared floor, `make test-floor`) does so only
    with ``mix_stderr=False``. The commands themselves are the same on both."""
    import inspect

    from click.testing import CliRunner

    if "mix_stderr" not in inspect.signature(CliRunner.__init__).parameters:
        return
    init = CliRunner.__init__

    def __init__(
        self: CliRunner, *args: object, mix_stderr: bool = False, **kwargs: object
    ) -> None:
        init(self, *args, mix_stderr=mix_stderr, **kwargs)  # type: ignore[misc]

    CliRunner.__init__ = __init__  # type: ignore[method-assign]


_separate_stderr_on_click_8_1()


@pytest.fixture(autouse=True)
def _the_working_directory_comes_back() -> Iterator[None]:
    """A test that changes directory (os.chdir, not monkeypatch.chdir) would leave the rest
    of the run in its tmp_path, which is removed when it passes: every later relative path
    would fail. It fails instead, and the directory is put back."""
    before = os.getcwd()
    yield
    after = os.getcwd() if os.path.isdir(".") else None
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left the working directory in {after} (use monkeypatch.chdir)")


@pytest.fixture
def mnist_pair(tmp_path: Path) -> Callable[..., tuple[Path, Path, np.ndarray, np.ndarray]]:
    """Factory: ``mnist_pair(count, rows=28, cols=28, gz=False, stem="train")`` writes an
    image file and a label file in tmp_path and returns (images_path, labels_path, images, labels)."""

    def make(
        count: int = 25,
        rows: int = 28,
        cols: int = 28,
        *,
        gz: bool = False,
        stem: str = "train",
        seed: int = 0,
    ) -> tuple[Path, Path, np.ndarray, np.ndarray]:
        images = make_images(count, rows, cols, seed=seed)
        labels = make_labels(count, seed=seed + 1)
        suffix = ".gz" if gz else ""
        ipath = write_idx(tmp_path / f"{stem}-images-idx3-ubyte{suffix}", images, gz=gz)
        lpath = write_idx(tmp_path / f"{stem}-labels-idx1-ubyte{suffix}", labels, gz=gz)
        return ipath, lpath, images, labels

    return make


@pytest.fixture(params=["lmdb", "leveldb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend in turn (a test's own parametrization of ``backend`` takes precedence)."""
    return str(request.param)
