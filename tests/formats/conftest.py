"""Fixtures of the format tests."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from mnist2db.formats.imread.cv2_wheel import NO_OPENCV, opencv

#: The decoding paths: OpenCV's wheel where it is proved to give Caffe's pixels, or Pillow.
DECODERS = ["opencv", "pure"]


@pytest.fixture(params=DECODERS)
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The decoding path: OpenCV's wheel where it is proved to give Caffe's pixels, or Pillow."""
    if request.param == "opencv" and opencv() is None:
        pytest.skip("OpenCV's wheel is not installed")
    if request.param == "pure":
        monkeypatch.setenv(NO_OPENCV, "1")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")  # as the front ends run
        yield request.param
