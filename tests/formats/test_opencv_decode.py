"""JPEG decoding by OpenCV's wheel (mnist2db.formats.imread.cv2_wheel) against the Pillow path: the
same pixels for every plain JPEG, and the Pillow path for every JPEG that is not plain (EXIF,
CMYK), whatever the wheel would do."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mnist2db.formats.imread.cv2_wheel import NO_OPENCV, opencv, reads_cut_jpegs
from mnist2db.formats.imread.reader import decode_image

pytestmark = pytest.mark.skipif(opencv() is None, reason="OpenCV's wheel is not installed")


def jpeg(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", **options)
    return out.getvalue()


def both(data: bytes, color: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, ...]:
    fast = decode_image(data, color=color, where="x.jpg")
    with monkeypatch.context() as patch:
        patch.setenv(NO_OPENCV, "1")
        pure = decode_image(data, color=color, where="x.jpg")
    return fast, pure


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 300), st.integers(1, 300), st.booleans(), st.integers(30, 100),
    st.sampled_from([0, 1, 2]), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_wheel_and_pillow_agree_on_plain_jpegs(
    h, w, grey, quality, subsampling, progressive, color, seed
) -> None:
    rng = np.random.default_rng(seed)
    # Smooth content with noise: what photographs hold, unlike pure noise.
    base = rng.integers(0, 256, (max(1, h // 8), max(1, w // 8), 1 if grey else 3), np.uint8)
    pixels = np.asarray(Image.fromarray(base.squeeze(-1) if grey else base).resize((w, h)))
    data = jpeg(pixels, quality=quality, subsampling=subsampling, progressive=progressive)
    with pytest.MonkeyPatch.context() as patch:
        fast, pure = both(data, color, patch)
    assert fast.shape == pure.shape and fast.dtype == pure.dtype
    assert np.array_equal(fast, pure)


def test_a_jpeg_with_exif_takes_the_pillow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """EXIF orientation 6 (rotate): transposed as Caffe's OpenCV transposes it."""
    pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    fast, pure = both(jpeg(pixels, exif=exif.tobytes()), True, monkeypatch)
    assert fast.shape == (30, 20, 3)
    assert np.array_equal(fast, pure)


def test_a_cmyk_jpeg_takes_the_pillow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "CMYK").save(out, "JPEG")
    fast, pure = both(out.getvalue(), True, monkeypatch)
    assert np.array_equal(fast, pure)


def test_the_variable_is_honoured_as_soon_as_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """MNIST2DB_NO_OPENCV set, emptied and removed in a running process: each change seen by
    the next call (the module reads the mapping behind os.environ, not a copy of it)."""
    loaded = opencv()
    assert loaded is not None
    monkeypatch.setenv(NO_OPENCV, "1")
    assert opencv() is None
    monkeypatch.setenv(NO_OPENCV, "")
    assert opencv() is loaded
    monkeypatch.setenv(NO_OPENCV, "yes")
    assert opencv() is None
    monkeypatch.delenv(NO_OPENCV)
    assert opencv() is loaded


def test_the_cut_jpeg_probe_is_a_property_of_the_wheel() -> None:
    """reads_cut_jpegs: the same answer every call, and the answer of a cut JPEG decoded here
    (4.7 reads one; later wheels refuse it)."""
    cv2 = opencv()
    assert cv2 is not None
    pixels = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = np.frombuffer(jpeg(pixels, quality=90), dtype=np.uint8)
    cut = data[: len(data) * 2 // 3]
    read = cv2.imdecode(cut, cv2.IMREAD_COLOR) is not None
    assert reads_cut_jpegs(cv2) is read
    assert reads_cut_jpegs(cv2) is read
