"""A JPEG missing only its EOI marker is read, as Caffe's libjpeg reads it (the file with the
EOI put back); one cut anywhere before (inside a scan, between a progressive file's scans, in
a header) is refused as before: ``completed_jpeg`` (formats/jpeg_scans.py) says which, on the
hostile corpus (tests/jpeg_helpers.py), on random JPEGs of every layout, and on hostile
headers; ``decode_image`` and ``image_shape`` read what it says, on OpenCV's wheel and the
pure path, colour and grey.
"""

from __future__ import annotations

import io
import re
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jpeg_helpers import base_jpegs, hostile_corpus, jpeg_bytes, segments, smooth_pixels
from PIL import Image

from mnist2db.errors import ImageError
from mnist2db.formats.imread.cv2_wheel import NO_OPENCV
from mnist2db.formats.imread.reader import decode_image, image_shape
from mnist2db.formats.jpeg_scans import EOI, completed_jpeg

BASES = base_jpegs()
CORPUS = list(hostile_corpus())


def missing_only_the_eoi(name: str) -> bool:
    """Whether a corpus file is its base cut after the last scan's data: in its EOI."""
    base, _, what = name.partition(": ")
    cut = re.fullmatch(r"cut at (\d+)", what)
    return what == "EOI removed" or (cut is not None and int(cut.group(1)) >= len(BASES[base]) - 2)


def whole_but_the_eoi(name: str) -> bool:
    """Missing only its EOI, or with the EOI's first byte damaged (FE D9: two bytes after
    the last scan that libjpeg skips, as it skips any, before the EOI it puts in)."""
    base, _, what = name.partition(": ")
    flip = re.fullmatch(r"bit \d of (\d+) flipped", what)
    damaged_eoi = flip is not None and int(flip.group(1)) == len(BASES[base]) - 2
    return missing_only_the_eoi(name) or (damaged_eoi and BASES[base].endswith(EOI))


def pillows_refusal(data: bytes) -> str:
    """What Pillow says of a damaged JPEG: the reason the skip line gives."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        try:
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()
        except OSError as exc:
            return str(exc)
    raise AssertionError("Pillow read it")


def shape_of(image: np.ndarray) -> tuple[int, int, int]:
    return (1 if image.ndim == 2 else image.shape[2]), image.shape[0], image.shape[1]


def test_completed_exactly_the_corpus_files_missing_only_their_eoi() -> None:
    """Of 8,301 damaged JPEGs, those whose every scan is whole and only the EOI gone (cut
    in it, or it removed: 3 of each of the 14 layouts) are completed, with the EOI put back,
    and the one whose EOI's first byte is damaged after whole scans; none other, so every
    other file is read or refused as before (the completion is tried on nothing else)."""
    completed = {name for name, data in CORPUS if completed_jpeg(data) is not None}
    expected = {name for name, _ in CORPUS if whole_but_the_eoi(name)}
    assert completed == expected
    assert len({name for name in expected if missing_only_the_eoi(name)}) == 3 * len(BASES)
    for name, data in CORPUS:
        if name in expected:
            assert completed_jpeg(data) == data + EOI


@pytest.mark.parametrize("color", [True, False], ids=["colour", "grey"])
def test_a_jpeg_missing_only_its_eoi_is_read_as_the_whole_file(decoder: str, color: bool) -> None:
    """Read, with the pixels of the whole file (what Caffe's libjpeg makes of it), and
    image_shape says so at an eighth of the size."""
    for name, data in CORPUS:
        if missing_only_the_eoi(name):
            whole = decode_image(BASES[name.partition(": ")[0]], color=color, where="x.jpg")
            got = decode_image(data, color=color, where="x.jpg")
            assert got.dtype == whole.dtype and np.array_equal(got, whole), name
            assert image_shape(data, color=color, where="x.jpg") == shape_of(whole), name


@pytest.mark.parametrize("color", [True, False], ids=["colour", "grey"])
def test_a_jpeg_cut_inside_its_scans_is_refused_as_before(decoder: str, color: bool) -> None:
    """Every cut of the corpus before the EOI, past the headers (inside a scan's data, or
    between a progressive file's scans), is refused with Pillow's own reason, as before."""
    refused = 0
    for name, data in CORPUS:
        base, _, what = name.partition(": ")
        cut = re.fullmatch(r"cut at (\d+)", what)
        if cut is None or missing_only_the_eoi(name):
            continue
        if int(cut.group(1)) < segments(BASES[base])[-1][2]:
            continue  # cut in the headers
        reason = pillows_refusal(data)
        for decide in (decode_image, image_shape):
            with pytest.raises(ImageError) as refusal:
                decide(data, color=color, where="x.jpg")
            assert str(refusal.value) == f"x.jpg: JPEG image cannot be decoded: {reason}", name
        refused += 1
    assert refused > 400


def test_a_progressive_jpeg_missing_its_later_scans_is_not_whole() -> None:
    """Cut at the end of each scan's data but the last (every MCU of that scan there, the
    refinements after it missing): not whole; only the end of the last scan is."""
    for name in ("progressive-420", "grey-progressive", "restarts-progressive-rows"):
        data = BASES[name]
        scan_ends = [m.start() for m in re.finditer(rb"\xff[\xc4\xda]", data)]
        scan_ends = [at for at in scan_ends if at > segments(data)[-1][2]]
        assert len(scan_ends) >= 5, name
        for at in scan_ends:
            assert completed_jpeg(data[:at]) is None, (name, at)
        assert completed_jpeg(data[:-2]) == data


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 160), st.integers(1, 160), st.sampled_from(["RGB", "L", "CMYK"]),
    st.sampled_from([0, 1, 2]), st.integers(20, 100), st.booleans(), st.booleans(),
    st.sampled_from([None, 1, 3, 7]), st.integers(0, 2**30), st.data(),
)  # fmt: skip
def test_random_jpegs_are_completed_only_when_cut_in_their_eoi(
    height, width, mode, subsampling, quality, progressive, optimize, restarts, seed, data
) -> None:
    channels = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    options: dict[str, object] = {"quality": quality, "progressive": progressive}
    options["optimize"] = optimize
    if mode == "RGB":
        options["subsampling"] = subsampling
    if restarts:
        options["restart_marker_blocks"] = restarts
    pixels = smooth_pixels(height, width, channels, seed)
    whole = jpeg_bytes(pixels, "CMYK" if mode == "CMYK" else None, **options)
    cut = data.draw(st.integers(0, len(whole) - 1) | st.integers(len(whole) - 40, len(whole) - 1))
    short = whole[: max(cut, 0)]
    completed = completed_jpeg(short)
    assert (completed is not None) == (len(short) >= len(whole) - 2)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        for pure in (False, True):
            if pure:
                patch.setenv(NO_OPENCV, "1")
            for color in (True, False):
                if completed is None:
                    with pytest.raises(ImageError):
                        decode_image(short, color=color, where="x.jpg")
                    continue
                want = decode_image(whole, color=color, where="x.jpg")
                assert np.array_equal(decode_image(short, color=color, where="x.jpg"), want)
                assert image_shape(short, color=color, where="x.jpg") == shape_of(want)


def _frame_declaring(data: bytes, height: int, width: int) -> bytes:
    frame = next(start for marker, start, _ in segments(data) if marker in (0xC0, 0xC2))
    return (
        data[: frame + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[frame + 9 :]
    )


def test_hostile_jpegs_are_decided_within_bounds() -> None:
    """A frame declaring 30,000 × 30,000 (OpenCV would read it; more than MAX_PIXELS) or
    8,000 × 8,000 with a small scan, a file ending in its EOI, a scan with no frame: not
    whole; whole scans followed by 4 MB of junk (what libjpeg skips before the EOI it puts
    in): whole. Each decided in a few MB."""
    small = BASES["progressive-420"]
    junk = BASES["baseline-420"][:-2]
    cases = {
        "declared 30000 x 30000": (_frame_declaring(small, 30000, 30000)[:-2], None),
        "declared 8000 x 8000": (_frame_declaring(small, 8000, 8000)[:-2], None),
        "declared 30000 x 30000, baseline": (
            _frame_declaring(BASES["grey"], 30000, 30000)[:-2],
            None,
        ),
        "4 MB after the scan": (junk + b"\x00" * (4 << 20), True),
        "4 MB of stuffed FFs": (junk + b"\xff\x00" * (2 << 20), True),
        "ends in its EOI": (small, None),
        "bytes after the EOI": (small + b"\x00\x01", None),
        "a scan with no header": (
            b"\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + b"\x12" * 99,
            None,
        ),
        "no frame": (b"\xff\xd8\xff\xfe\x00\x04ab", None),
    }
    for what, (data, whole) in cases.items():
        tracemalloc.start()
        try:
            completed = completed_jpeg(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert completed == (data + EOI if whole else None), what
        assert peak < len(data) * 6 + (16 << 20), (what, peak)
    read = decode_image(junk + b"\x00" * 99, color=True, where="x.jpg")
    assert np.array_equal(read, decode_image(BASES["baseline-420"], color=True, where="x.jpg"))
