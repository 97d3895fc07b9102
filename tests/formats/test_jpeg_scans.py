"""A JPEG missing only its EOI marker is read, as Caffe's libjpeg reads it (the file with the
EOI put back); one cut anywhere before (inside a scan, between a progressive file's scans, in
a header) is refused as before: ``completed_jpeg`` (formats/jpeg_scans.py) says which, on the
hostile corpus (tests/jpeg_helpers.py), on random JPEGs of every layout, and on hostile
headers within bounds; ``decode_image`` and ``image_shape`` read what it says, on OpenCV's
wheel and the pure path, colour and grey.
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
from mnist2db.formats.jpeg_scans import EOI, MAX_WALKED_BYTES, completed_jpeg

BASES = base_jpegs()
CORPUS = list(hostile_corpus())


def missing_only_the_eoi(name: str) -> bool:
    """Whether a corpus file is its base cut after the last scan's data: in its EOI."""
    base, _, what = name.partition(": ")
    cut = re.fullmatch(r"cut at (\d+)", what)
    return what == "EOI removed" or (cut is not None and int(cut.group(1)) >= len(BASES[base]) - 2)


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
    in it, or it removed: 3 of each of the 14 layouts) are completed, with the EOI put back;
    none other, so every other file is read or refused as before (the completion is tried
    on nothing else)."""
    completed = {name for name, data in CORPUS if completed_jpeg(data) is not None}
    expected = {name for name, _ in CORPUS if missing_only_the_eoi(name)}
    assert completed == expected
    assert len(expected) == 3 * len(BASES)
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


def test_hostile_jpegs_are_not_whole_within_bounds() -> None:
    """A frame declaring 30,000 × 30,000 (OpenCV would read it), a scan followed by 4 MB of
    data, a file ending in its EOI, a whole one with bytes after it: not whole, each decided
    in a few MB."""
    small = BASES["progressive-420"]
    cases = {
        "declared 30000 x 30000": _frame_declaring(small, 30000, 30000)[:-2],
        "declared 8000 x 8000": _frame_declaring(small, 8000, 8000)[:-2],
        "declared 30000 x 30000, baseline": _frame_declaring(BASES["grey"], 30000, 30000)[:-2],
        "4 MB after the scan": BASES["baseline-420"][:-2] + b"\x00" * (4 << 20),
        "4 MB of stuffed FFs": BASES["baseline-420"][:-2] + b"\xff\x00" * (2 << 20),
        "ends in its EOI": small,
        "bytes after the EOI": small + b"\x00\x01",
        "a scan with no header": b"\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + b"\x12" * 99,
        "no frame": b"\xff\xd8\xff\xfe\x00\x04ab",
    }
    for what, data in cases.items():
        tracemalloc.start()
        try:
            assert completed_jpeg(data) is None, what
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < len(data) * 6 + (16 << 20), (what, peak)


def _padded_to(data: bytes, size: int) -> bytes:
    """``data`` (a JPEG) made ``size`` bytes long by comment segments after its SOI (each
    segment 4 to 65,537 bytes: its marker, its length, the comment)."""
    padding, left = [], size - len(data)
    while left:
        n = min(left, 65537)
        if 0 < left - n < 4:
            n -= 4
        padding.append(b"\xff\xfe" + (n - 2).to_bytes(2, "big") + b"c" * (n - 4))
        left -= n
    return data[:2] + b"".join(padding) + data[2:]


def test_a_file_longer_than_the_walks_bound_stays_refused() -> None:
    """At the bound a JPEG missing only its EOI is completed; a byte more and it is refused
    (so which files are completed never depends on how fast the machine walks them)."""
    whole = BASES["progressive-420"]
    at_bound = _padded_to(whole, MAX_WALKED_BYTES + 2)
    assert len(at_bound) == MAX_WALKED_BYTES + 2 and at_bound.endswith(EOI)
    assert completed_jpeg(at_bound[:-2]) == at_bound
    past = _padded_to(whole, MAX_WALKED_BYTES + 3)
    assert len(past) == MAX_WALKED_BYTES + 3
    assert completed_jpeg(past[:-2]) is None


@pytest.mark.parametrize("name", ["baseline-420", "progressive-420"])
def test_a_file_whose_scans_cover_more_blocks_than_the_bound_stays_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocks all scans cover are counted: a file within the bound is completed, the same
    file with the bound one block lower is refused (time is bounded by blocks, not bytes
    alone: a smooth progressive photo walks ~0.6 MB/s)."""
    import mnist2db.formats.jpeg_scans as jpeg_scans

    whole = BASES[name]
    walk = jpeg_scans._Walk(whole[:-2])
    walk.run()
    scanned = jpeg_scans._MAX_SCANNED_BLOCKS - walk.unscanned_blocks
    # 45 x 37, 4:2:0: 9 MCUs of 6 blocks; a luma scan alone 6 x 5 blocks, a chroma 3 x 3.
    # Progressive (libjpeg's usual ten scans): two interleaved DC scans, four of luma AC,
    # two of each chroma's AC.
    assert scanned == {"baseline-420": 54, "progressive-420": 2 * 54 + 4 * 30 + 4 * 9}[name]
    monkeypatch.setattr(jpeg_scans, "_MAX_SCANNED_BLOCKS", scanned)
    assert completed_jpeg(whole[:-2]) == whole
    monkeypatch.setattr(jpeg_scans, "_MAX_SCANNED_BLOCKS", scanned - 1)
    assert completed_jpeg(whole[:-2]) is None
