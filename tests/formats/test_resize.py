"""OpenCV's INTER_LINEAR resize (mnist2db.formats.imread.resize): against OpenCV's own output on
recorded random cases, and against a per-pixel reference written from OpenCV's source."""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.formats.imread.cv2_wheel import opencv
from mnist2db.formats.imread.resize import resize_linear, resize_numpy

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, "data", "imageset")
with open(os.path.join(CORPUS, "resize.json"), encoding="utf-8") as _stream:
    CASES = json.load(_stream)["cases"]


@pytest.mark.parametrize("resize", [resize_linear, resize_numpy])
def test_matches_opencv_on_recorded_cases(resize) -> None:
    """Caffe's OpenCV (4.6) on recorded cases: the wheel's cv2.resize where installed (the
    test extra has it) and the numpy path."""
    assert len(CASES) >= 300
    wrong = []
    for case in CASES:
        h, w, c = case["shape"]
        pixels = np.random.default_rng(case["seed"]).integers(0, 256, (h, w, c), dtype=np.uint8)
        image = pixels[:, :, 0] if c == 1 else pixels
        out = resize(image, *case["size"])
        assert out.shape == ((case["size"][1], case["size"][0]) + (() if c == 1 else (3,)))
        if hashlib.sha256(out.tobytes()).hexdigest() != case["sha256"]:
            wrong.append(case)
    assert wrong == []


@pytest.mark.skipif(opencv() is None, reason="OpenCV's wheel is not installed")
@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 700), st.integers(1, 700), st.sampled_from([1, 3, 4]),
    st.integers(1, 400), st.integers(1, 400), st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_opencv_wheel_and_numpy_agree(h, w, c, nh, nw, seed) -> None:
    """The two paths of resize_linear give the same bytes, photo sizes included (up to
    700 × 700 to 400 × 400, up and down, grey, BGR and BGRA)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)
    image = pixels[:, :, 0] if c == 1 else pixels
    fast = resize_linear(image, nw, nh)
    assert fast.shape == resize_numpy(image, nw, nh).shape
    assert np.array_equal(fast, resize_numpy(image, nw, nh))


def _taps(source: int, target: int, clamp: bool) -> list[tuple[int, int, int, int]]:
    """(first, second, weight0, weight1) per destination index, one at a time in Python."""
    scale = source / target
    out = []
    for d in range(target):
        f = float(np.float32((d + 0.5) * scale - 0.5))
        s = math.floor(f)
        frac = float(np.float32(f - s))
        if clamp and s < 0:
            s, frac = 0, 0.0
        if clamp and s >= source - 1:
            s, frac = source - 1, 0.0
        w0 = round(float(np.float32(np.float32(1.0 - frac) * 2048)))  # half to even, as cvRound
        w1 = round(float(np.float32(frac * 2048)))
        out.append((min(max(s, 0), source - 1), min(max(s + 1, 0), source - 1), w0, w1))
    return out


def reference(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """cv::resize INTER_LINEAR for uint8, pixel by pixel (resize.cpp's steps)."""
    rows, cols = image.shape[:2]
    img = image.reshape(rows, cols, -1).astype(int)
    if (rows, cols) == (height, width):
        return image.copy()
    out = np.zeros((height, width, img.shape[2]), dtype=np.uint8)
    if (cols, rows) == (2 * width, 2 * height):
        for y in range(height):
            for x in range(width):
                block = img[2 * y : 2 * y + 2, 2 * x : 2 * x + 2]
                out[y, x] = (block.sum(axis=(0, 1)) + 2) >> 2
        return out.reshape((height, width) + image.shape[2:])
    xs, ys = _taps(cols, width, True), _taps(rows, height, False)
    for y, (r0, r1, b0, b1) in enumerate(ys):
        for x, (c0, c1, a0, a1) in enumerate(xs):
            for ch in range(img.shape[2]):
                s0 = img[r0, c0, ch] * a0 + img[r0, c1, ch] * a1
                s1 = img[r1, c0, ch] * a0 + img[r1, c1, ch] * a1
                value = (((b0 * (s0 >> 4)) >> 16) + ((b1 * (s1 >> 4)) >> 16) + 2) >> 2
                out[y, x, ch] = min(255, max(0, value))
    return out.reshape((height, width) + image.shape[2:])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12), st.integers(1, 12), st.sampled_from([1, 3]),
    st.integers(1, 15), st.integers(1, 15), st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_matches_the_per_pixel_reference(h, w, c, nh, nw, seed) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)
    image = pixels[:, :, 0] if c == 1 else pixels
    assert np.array_equal(resize_linear(image, nw, nh), reference(image, nw, nh))


def test_half_size_is_the_rounded_block_mean() -> None:
    image = np.array([[0, 1, 2, 2], [1, 1, 2, 3]], dtype=np.uint8)
    assert resize_linear(image, 2, 1).tolist() == [[1, 2]]


def test_refuses_an_empty_size() -> None:
    with pytest.raises(ValueError, match="cannot resize to 0 × 3"):
        resize_linear(np.zeros((2, 2), dtype=np.uint8), 0, 3)
