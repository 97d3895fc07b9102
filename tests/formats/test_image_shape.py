"""``image_shape``, the check ``--encoded`` makes of a file it stores as it is, against
``decode_image``, the full decode: the same images read, with the same shape, and the same
refused, with the same reason, on a hostile corpus of JPEGs (tests/jpeg_helpers.py), by
OpenCV's wheel and by the pure path, in colour and grey; the eighth-size decodes it rests
on refuse exactly what the full decodes refuse; and it is the eighth-size decode that runs.
"""

from __future__ import annotations

import io
import tracemalloc
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jpeg_helpers import base_jpegs, hostile_corpus, jpeg_bytes
from PIL import Image

from mnist2db.errors import ImageError
from mnist2db.formats.imread.cv2_wheel import NO_OPENCV, opencv
from mnist2db.formats.imread.reader import decode_image, image_shape

CORPUS = list(hostile_corpus())
BASES = base_jpegs()


def outcome(
    decide: Callable[[bytes, bool], tuple[int, int, int]], data: bytes, color: bool
) -> tuple[str, object]:
    try:
        return "read", decide(data, color)
    except ImageError as exc:
        return "refused", str(exc)


def full(data: bytes, color: bool) -> tuple[int, int, int]:
    image = decode_image(data, color=color, where="x.jpg")
    return (1 if image.ndim == 2 else image.shape[2]), image.shape[0], image.shape[1]


def cheap(data: bytes, color: bool) -> tuple[int, int, int]:
    return image_shape(data, color=color, where="x.jpg")


def test_the_corpus_holds_every_layout_and_both_outcomes() -> None:
    """The corpus is what the other tests need it to be: every base read, each at least 8
    pixels a side (else the eighth-size decode is not tried), many damaged ones refused."""
    for data in BASES.values():
        with Image.open(io.BytesIO(data)) as opened:
            assert min(opened.size) >= 8
    modes = {Image.open(io.BytesIO(data)).mode for data in BASES.values()}
    assert modes == {"L", "RGB", "CMYK"}
    assert any(Image.open(io.BytesIO(d)).info.get("progressive") for d in BASES.values())
    assert len(CORPUS) > 5000


@pytest.mark.parametrize("color", [True, False], ids=["colour", "grey"])
def test_image_shape_reads_and_refuses_what_decode_image_does(decoder: str, color: bool) -> None:
    differ = []
    read = 0
    for name, data in CORPUS:
        expected = outcome(full, data, color)
        got = outcome(cheap, data, color)
        read += expected[0] == "read"
        if got != expected:
            differ.append(f"{name}: full {expected}, image_shape {got}")
    assert not differ, f"{len(differ)} of {len(CORPUS)} differ:\n" + "\n".join(differ[:20])
    assert 0.3 < read / len(CORPUS) < 0.8  # both outcomes, many times


def _cv2_reads(data: bytes, flag: int) -> tuple[int, int] | None:
    cv2 = opencv()
    assert cv2 is not None
    if not data:
        return None  # imdecode asserts on an empty buffer
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    return None if decoded is None else decoded.shape[:2]


def _pillow_reads(data: bytes, mode: str | None, eighth: bool) -> tuple[int, int] | None:
    try:
        with Image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
            if eighth or mode:
                wanted = (max(1, width // 8), max(1, height // 8)) if eighth else opened.size
                opened.draft(mode or opened.mode, wanted)
            opened.load()
            return opened.size[1], opened.size[0]
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def _eighth(shape: tuple[int, int] | None) -> tuple[int, int] | None:
    return None if shape is None else (-(-shape[0] // 8), -(-shape[1] // 8))


@pytest.mark.skipif(opencv() is None, reason="OpenCV's wheel is not installed")
@pytest.mark.parametrize("color", [True, False], ids=["colour", "grey"])
def test_opencvs_eighth_size_decode_refuses_what_its_full_decode_refuses(color: bool) -> None:
    cv2 = opencv()
    assert cv2 is not None
    flags = ((cv2.IMREAD_COLOR, cv2.IMREAD_REDUCED_COLOR_8) if color
             else (cv2.IMREAD_GRAYSCALE, cv2.IMREAD_REDUCED_GRAYSCALE_8))  # fmt: skip
    differ = []
    for name, data in CORPUS:
        whole, eighth = _cv2_reads(data, flags[0]), _cv2_reads(data, flags[1])
        if _eighth(whole) != eighth:
            differ.append(f"{name}: full {whole}, an eighth {eighth}")
    assert not differ, "\n".join(differ[:20])


@pytest.mark.parametrize("mode", [None, "L"], ids=["own-mode", "grey"])
def test_pillows_eighth_size_decode_refuses_what_its_full_decode_refuses(
    mode: str | None,
) -> None:
    differ = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        for name, data in CORPUS:
            whole, eighth = _pillow_reads(data, mode, False), _pillow_reads(data, mode, True)
            # (Pillow scales a side below 8 by less: only whether it reads is compared.)
            if (whole is None) != (eighth is None):
                differ.append(f"{name}: full {whole}, an eighth {eighth}")
    assert not differ, "\n".join(differ[:20])


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(BASES)), st.booleans(), st.integers(0, 1 << 20),
    st.integers(1, 255), st.integers(0, 1 << 20), st.booleans(),
)  # fmt: skip
def test_random_damage_is_read_or_refused_as_the_full_decode_does(
    base: str, color: bool, at: int, xor: int, cut: int, pure: bool
) -> None:
    data = bytearray(BASES[base])
    data[at % len(data)] ^= xor
    damaged = bytes(data[: len(data) - cut % 64])
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        if pure:
            patch.setenv(NO_OPENCV, "1")
        assert outcome(cheap, damaged, color) == outcome(full, damaged, color)


@pytest.mark.parametrize("orientation", [1, 3, 5, 6, 8])
def test_the_shape_is_the_oriented_one(decoder: str, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    pixels = np.zeros((24, 40, 3), np.uint8)
    data = jpeg_bytes(pixels, exif=exif.tobytes())
    for color in (True, False):
        assert cheap(data, color) == full(data, color)
    assert cheap(data, True)[1:] == ((40, 24) if orientation >= 5 else (24, 40))


@pytest.mark.parametrize("ending", ["whole", "without its EOI"])
@pytest.mark.parametrize("color", [True, False], ids=["colour", "grey"])
def test_the_eighth_size_decode_is_what_runs(decoder: str, color: bool, ending: str) -> None:
    """A flat 6,000 × 6,000 JPEG: decoded in full, its pixels take 108 MB (colour) or 36 MB
    (grey) of numpy arrays (OpenCV's, or the copy of Pillow's); at an eighth, 1.7 MB or less.
    Deciding its shape allocates far less than the full size, also when it lacks its EOI
    (its scans walked, then the eighth-size decode of it with the EOI put back)."""
    big = jpeg_bytes(np.full((6000, 6000, 3), 90, np.uint8), quality=50)
    big = big if ending == "whole" else big[:-2]
    tracemalloc.start()
    try:
        shape = cheap(big, color)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shape == ((3 if color else 1), 6000, 6000)
    assert peak < 8 << 20, f"{peak} bytes allocated deciding the shape"
