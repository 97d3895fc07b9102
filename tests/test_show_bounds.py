"""show bounds every drawing before the image is read or decoded: the
size comes from what the source declares (the IDX header, a Datum's fields, the PNG header
of an encoded image); a text drawing is at most MAX_TEXT_PIXELS, a PNG grid at most
MAX_PNG_PIXELS. ``show --ascii`` of a 30000 × 30000 image reached 4.4 GB and a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from db_helpers import write_lmdb
from helpers import write_idx

from mnist2db.formats.datum.message import datum_type
from mnist2db.formats.png.encoder import encode_png
from mnist2db.render import MAX_TEXT_PIXELS
from mnist2db.show import declared_shape

#: The child reports its peak resident memory in MB: VmHWM belongs to the address space
#: made by exec (ru_maxrss would carry the forking pytest process's peak over).
MEASURED = """
import sys
from mnist2db.cli.app import main
try:
    main(sys.argv[1:])
finally:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    sys.stderr.write(f"peak {peak // 1024}\\n")
"""


def _datum(height: int, width: int, data: bytes, *, encoded: bool, channels: int = 1) -> bytes:
    datum = datum_type()()
    datum.channels, datum.height, datum.width = channels, height, width
    datum.data, datum.encoded, datum.label = data, encoded, 3
    return bytes(datum.SerializeToString())


def _show(*args: object) -> tuple[int, str, str, int]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, "show", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    *lines, peak = done.stderr.splitlines()
    return done.returncode, done.stdout, "\n".join(lines) + "\n", int(peak.split()[1])


@pytest.fixture
def huge_png_db(tmp_path: Path) -> Path:
    """One PNG record of 9000 × 9000 (81 MB of pixels; about 80 kB stored)."""
    png = encode_png(np.zeros((9000, 9000), dtype=np.uint8))
    return write_lmdb(tmp_path / "png_db", {b"00000000": _datum(9000, 9000, png, encoded=True)})


@pytest.mark.parametrize("mode", [["--ascii"], [], ["--threshold", "3"]])
def test_a_huge_encoded_image_is_refused_before_it_is_decoded(
    huge_png_db: Path, mode: list[str]
) -> None:
    code, out, err, peak = _show(huge_png_db, *mode)
    assert (code, out) == (1, "")
    assert err == (
        f"Error: {huge_png_db}: record 0: a 9000 × 9000 image is too large to draw as text "
        f"(more than {MAX_TEXT_PIXELS} pixels; write it with --png, or look at it with "
        "another tool)\n"
    )
    assert peak < 100  # MB: the 81 MB of pixels were never decoded


def test_a_huge_encoded_image_is_refused_before_the_png_grid(
    huge_png_db: Path, tmp_path: Path
) -> None:
    target = tmp_path / "grid.png"
    code, out, err, peak = _show(huge_png_db, "--png", target)
    assert (code, out) == (1, "")
    assert err == (
        f"Error: {target}: 1 images of 9000 × 9000 make a 27008 × 27022 canvas, more than "
        "64000000 pixels (one image is already too large)\n"
    )
    assert peak < 100
    assert not target.exists()


def test_a_large_raw_record_is_refused_as_text(tmp_path: Path) -> None:
    db = write_lmdb(
        tmp_path / "raw_db",
        {
            b"00000000": _datum(2, 2, bytes(4), encoded=False),
            b"00000001": _datum(1001, 1000, bytes(1001 * 1000), encoded=False),
        },
    )
    code, out, err, _ = _show(db, "--ascii")
    assert code == 1
    assert out.startswith("#0  key 00000000  label 3\n")  # the small one was drawn
    assert "#1" not in out
    assert err == (
        f"Error: {db}: record 1: a 1001 × 1000 image is too large to draw as text (more "
        f"than {MAX_TEXT_PIXELS} pixels; write it with --png, or look at it with another tool)\n"
    )


def test_a_pair_is_measured_as_drawn(tmp_path: Path) -> None:
    """A 2-channel record (a siamese pair) is drawn twice as wide: 708 × 708 fits one
    channel (501 264 pixels) but not two side by side (708 × 1417)."""
    db = write_lmdb(
        tmp_path / "pair_db",
        {b"00000000": _datum(708, 708, bytes(2 * 708 * 708), encoded=False, channels=2)},
    )
    code, _, err, _ = _show(db)
    assert code == 1
    assert "a 708 × 1417 image is too large to draw as text" in err


def test_an_idx_file_of_large_images_is_refused_before_reading(tmp_path: Path) -> None:
    images = write_idx(tmp_path / "big-images-idx3-ubyte", np.zeros((2, 1000, 1001), np.uint8))
    code, out, err, _ = _show(images, "--offset", "1")
    assert (code, out) == (1, "")
    assert err == (
        f"Error: {images}: record 1: a 1000 × 1001 image is too large to draw as text (more "
        f"than {MAX_TEXT_PIXELS} pixels; write it with --png, or look at it with another tool)\n"
    )
    code, out, err, _ = _show(images, "--transpose", "--count", "1")
    assert "record 0: a 1001 × 1000 image is too large" in err


def test_an_empty_datum_is_named_as_one(tmp_path: Path) -> None:
    """An empty record is one line naming it (it said 'cannot draw float64 pixels')."""
    db = write_lmdb(tmp_path / "empty_db", {b"00000000": b""})
    code, out, err, _ = _show(db)
    assert (code, out) == (1, "")
    assert err == (
        f"Error: {db}: key 00000000: an empty Datum (no data, no float_data): no image\n"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (_datum(3, 4, bytes(12), encoded=False), (1, 3, 4)),
        (_datum(0, 0, b"", encoded=False, channels=0), (0, 0, 0)),
        (_datum(5, 6, encode_png(np.zeros((7, 9), np.uint8)), encoded=True), (1, 7, 9)),
        (_datum(2, 2, b"GIF89a" + bytes(40), encoded=True), None),  # not a PNG: decoded first
        (_datum(-1, 4, b"", encoded=False), None),  # a negative size: not declared
        (b"\x0a\xff", None),  # a length past the end
        (b"\x0f", None),  # wire type 7
    ],
)
def test_declared_shape(value: bytes, expected: tuple[int, int, int] | None) -> None:
    assert declared_shape(value) == expected
