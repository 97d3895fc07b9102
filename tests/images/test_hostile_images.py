"""Hostile images named by a list or found in class folders: image bombs, files that are not
regular files, a small PNG hiding gigabytes. Each is skipped as Caffe skips what it cannot
read (named, counted), in bounded memory and time, never a traceback; both front ends
(``mnist2db imageset``, ``convert_imageset``) and ``imageset --to idx``, in real processes
(a FIFO that would block ends in the test's timeout, not in a hang)."""

from __future__ import annotations

import io
import os
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from os_helpers import in_forked_child
from png_helpers import chunk, png_of

from mnist2db.errors import ImageError
from mnist2db.formats.imdecode.image_file import declared_size, image_format, read_image_file
from mnist2db.formats.imread.reader import decode_image

MNIST2DB = [sys.executable, "-m", "mnist2db"]
CONVERT_IMAGESET = [
    sys.executable, "-c", "from mnist2db.caffe_tools.convert_imageset import main; main()",
]  # fmt: skip
LIMIT = "OpenCV reads at most 1048576 a side and 1073741824 pixels (CV_IO_MAX_IMAGE_PIXELS)"


def png_header(
    width: int, height: int, depth: int = 8, colour: int = 0, data: bytes = b""
) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data))
        + chunk(b"IEND", b"")
    )  # fmt: skip


#: Image files whose headers declare more than OpenCV reads, by format, and the size declared.
BOMBS = {
    "bomb.png": (png_header(65536, 65536), (65536, 65536)),
    "bomb.jpg": (
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
        b"\xff\xc0\x00\x0b\x08\xff\xff\xff\xff\x01\x01\x11\x00\xff\xd9",
        (65535, 65535),
    ),
    "bomb.bmp": (
        b"BM"
        + struct.pack("<IiI", 70, 0, 54)
        + struct.pack("<IiiHHIIiiII", 40, 40000, -40000, 1, 24, 0, 0, 0, 0, 0, 0)
        + bytes(16),
        (40000, 40000),
    ),  # fmt: skip
    "bomb.tif": (
        b"II*\x00"
        + struct.pack("<I", 8)
        + struct.pack("<H", 2)
        + struct.pack("<HHII", 256, 4, 1, 2_000_000)
        + struct.pack("<HHII", 257, 4, 1, 3)
        + struct.pack("<I", 0),
        (2_000_000, 3),
    ),  # fmt: skip
    "bomb.pgm": (b"P5\n# big\n100000 100000\n255\n" + bytes(64), (100000, 100000)),
    "bomb.webp": (
        b"RIFF"
        + struct.pack("<I", 22)
        + b"WEBPVP8X"
        + struct.pack("<I", 10)
        + bytes(4)
        + (40000 - 1).to_bytes(3, "little")
        + (40000 - 1).to_bytes(3, "little"),
        (40000, 40000),
    ),  # fmt: skip
}


def good_png(path: Path) -> None:
    path.write_bytes(png_of(np.arange(12, dtype=np.uint8).reshape(3, 4)))


def run(
    command: list[str], cwd: Path, limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` in a real process, its address space at most ``limit`` bytes; a hang
    ends at the timeout and fails the test."""

    def bounded() -> None:  # pragma: no cover - runs in the child
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
        preexec_fn=bounded,
    )  # fmt: skip


FRONT_ENDS = {
    "imageset": lambda: [*MNIST2DB, "imageset", "--list", "list.txt", "imgs/", "out"],
    "imageset --to idx": lambda: [
        *MNIST2DB,
        "imageset",
        "--to",
        "idx",
        "--list",
        "list.txt",
        "imgs/",
        "out",
    ],  # fmt: skip
    "convert_imageset": lambda: [*CONVERT_IMAGESET, "imgs/", "list.txt", "out"],
}


def reasons(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The reasons images were skipped, as either front end prints them."""
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    found = []
    for line in done.stderr.splitlines():
        if line.startswith("skipped: "):
            found.append(line[len("skipped: ") :])
        elif "Could not open or find file " in line:
            found.append(line.split("Could not open or find file ", 1)[1])
    return found


def written(tmp_path: Path, front_end: str) -> int:
    if front_end.endswith("idx"):
        return struct.unpack(">I", (tmp_path / "out-images-idx3-ubyte").read_bytes()[4:8])[0]
    import lmdb

    with lmdb.open(str(tmp_path / "out"), readonly=True, lock=False) as env:
        return int(env.stat()["entries"])


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_image_bombs_are_skipped_by_both_front_ends_and_idx(tmp_path: Path, front_end: str) -> None:
    """A header declaring more pixels than OpenCV reads (2^30, or 2^20 a side), in every
    format OpenCV reads, is skipped and named before any decoder allocates for it (Pillow's
    DecompressionBombError traceback before)."""
    (tmp_path / "imgs").mkdir()
    good_png(tmp_path / "imgs" / "good.png")
    for name, (data, _) in BOMBS.items():
        (tmp_path / "imgs" / name).write_bytes(data)
    names = ["good.png", *BOMBS]
    (tmp_path / "list.txt").write_text("".join(f"{n} {i}\n" for i, n in enumerate(names)))
    done = run(FRONT_ENDS[front_end](), tmp_path)
    assert reasons(done) == [
        f"imgs/{name}: its header declares {w} × {h} pixels; {LIMIT}"
        for name, (_, (w, h)) in BOMBS.items()
    ]
    assert written(tmp_path, front_end) == 1


@pytest.mark.parametrize("name", BOMBS)
def test_each_header_is_read_for_its_declared_size(name: str) -> None:
    data, size = BOMBS[name]
    assert declared_size(data, image_format(data)) == size


def test_an_image_past_pillows_limit_but_within_opencvs_is_decoded() -> None:
    """Pillow warns past 89 million pixels and refuses past twice that; OpenCV reads up to
    2^30: 90 million grey pixels decode (a DecompressionBombWarning, an error here, before)."""
    image = np.zeros((9000, 10000), dtype=np.uint8)
    image[4500, 5000] = 7
    pixels = decode_image(png_of(image), color=False, where="big.png")
    assert pixels.shape == (9000, 10000) and int(pixels.sum()) == 7


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_files_that_are_not_regular_files_are_never_read(tmp_path: Path, front_end: str) -> None:
    """A link to /dev/zero, a FIFO with no writer, a directory, a 3 GiB sparse file and a
    1.9 GiB sparse file of zeros: each skipped and named, at once and in bounded memory (a
    child limited to 1.5 GiB of address space; before: read whole until MemoryError, the
    FIFO blocking forever)."""
    images = tmp_path / "imgs"
    images.mkdir()
    good_png(images / "good.png")
    (images / "zero.png").symlink_to("/dev/zero")
    os.mkfifo(images / "fifo.png")
    (images / "folder.png").mkdir()
    with open(images / "huge.png", "wb") as sparse:
        sparse.truncate(3 << 30)
    with open(images / "zeros.png", "wb") as sparse:
        sparse.truncate(1900 << 20)
    names = ["zero.png", "fifo.png", "folder.png", "huge.png", "zeros.png", "good.png"]
    (tmp_path / "list.txt").write_text("".join(f"{n} {i}\n" for i, n in enumerate(names)))
    done = run(FRONT_ENDS[front_end](), tmp_path, limit=3 << 29)
    assert reasons(done) == [
        "imgs/zero.png: not a regular file (a character device): only an image file is read",
        "imgs/fifo.png: not a regular file (a FIFO): only an image file is read",
        "imgs/folder.png: not a regular file (a directory): only an image file is read",
        "imgs/huge.png: 3221225472 bytes; an image file is read up to 2147483647 bytes "
        "(protobuf's 2 GiB, what a record holds)",
        "imgs/zeros.png: not an image OpenCV reads (PNG, JPEG, BMP, PPM, TIFF, WebP)",
    ]
    assert written(tmp_path, front_end) == 1


@pytest.fixture(scope="module")
def hidden_gigabyte_png16() -> bytes:
    """A 16-bit RGB PNG declaring 1 × 1 pixels whose image data inflates to 1 GiB."""
    deflate = zlib.compressobj(9)
    parts = [deflate.compress(b"\x00\x01\x02\x03\x04\x05\x06")]
    zeros = bytes(1 << 24)
    parts.extend(deflate.compress(zeros) for _ in range(64))
    parts.append(deflate.flush())
    return png_header(1, 1, 16, 2)[:33] + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_a_16_bit_png_hiding_a_gigabyte_is_inflated_no_further_than_its_header(
    tmp_path: Path, front_end: str, hidden_gigabyte_png16: bytes
) -> None:
    """Its one pixel is read, as libpng reads it (the rest ignored), in a child limited to
    1.5 GiB of address space (before: inflated whole, MemoryError)."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "deep.png").write_bytes(hidden_gigabyte_png16)
    (tmp_path / "list.txt").write_text("deep.png 1\n")
    done = run(FRONT_ENDS[front_end](), tmp_path, limit=3 << 29)
    assert reasons(done) == []
    assert written(tmp_path, front_end) == 1
    if front_end.endswith("idx"):
        # RGB (0x0102, 0x0304, 0x0506): libpng's grey of the 16-bit samples, high byte.
        grey = ((9797 * 0x0102 + 19234 * 0x0304 + 3737 * 0x0506) >> 15) >> 8
        assert (tmp_path / "out-images-idx3-ubyte").read_bytes()[16:] == bytes((grey,))


def test_a_damaged_16_bit_png_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.png"
    path.write_bytes(
        png_header(2, 2, 16, 2)[:33] + chunk(b"IDAT", b"\x78\x9c\xff\xff") + chunk(b"IEND", b"")
    )
    with pytest.raises(
        ImageError, match=r"bad\.png: PNG image cannot be decoded: PNG image data is "
    ):
        decode_image(read_image_file(str(path)), color=True, where=str(path))


def jpeg_with_a_broken_exif_tag() -> bytes:
    """A JPEG whose EXIF orientation tag claims 1000 values: Pillow warns "Tag data larger
    than file" and skips it; OpenCV, too, decodes the image unrotated."""
    from PIL import Image

    out = io.BytesIO()
    exif = Image.Exif()
    exif[274] = 6
    Image.fromarray(np.full((4, 6, 3), 200, dtype=np.uint8)).save(out, "JPEG", exif=exif.tobytes())
    data = bytearray(out.getvalue())
    entry = data.find(b"Exif\x00\x00") + 6 + 8 + 2  # the TIFF header, the IFD's count
    assert data[entry : entry + 2] == b"\x01\x12"  # big-endian tag 274
    data[entry + 4 : entry + 8] = (1000).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_pillows_warnings_about_a_file_never_reach_the_front_ends_lines(
    tmp_path: Path, front_end: str
) -> None:
    """The image is decoded (unrotated), and stderr holds the front end's lines only (before:
    Pillow's two-line UserWarning in the middle of Caffe's log)."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "exif.jpg").write_bytes(jpeg_with_a_broken_exif_tag())
    (tmp_path / "list.txt").write_text("exif.jpg 1\n")
    done = run(FRONT_ENDS[front_end](), tmp_path)
    assert reasons(done) == []
    assert "UserWarning" not in done.stderr and "larger than file" not in done.stderr
    assert written(tmp_path, front_end) == 1
    if front_end.endswith("idx"):
        assert (tmp_path / "out-images-idx3-ubyte").read_bytes()[8:16] == struct.pack(">II", 4, 6)


def test_a_warning_a_caller_makes_an_error_is_one_image_error() -> None:
    """Under pytest's filter (warnings are errors) a library call refuses the image in one
    ImageError, never Pillow's UserWarning raised through the caller (its text is Pillow's:
    "Tag data…" in newer releases, "Truncated File Read" in 10.0, the floor)."""
    with pytest.raises(ImageError, match="exif.jpg: JPEG image cannot be decoded: "):
        decode_image(jpeg_with_a_broken_exif_tag(), color=True, where="exif.jpg")


CORPUS = Path(__file__).parents[1] / "data" / "imageset" / "images"


def test_mutated_images_decode_or_are_refused_in_one_line() -> None:
    """600 cut or changed copies of every format's images (a fixed seed), decoded in a
    forked child (a crash in a C decoder fails the test, not the suite): each gives pixels
    or an ImageError, never another exception (nor a warning, errors here)."""
    import random

    def work() -> str:
        rng = random.Random(27)
        files = sorted(CORPUS.iterdir())
        escaped = []
        for _ in range(600):
            path = rng.choice(files)
            data = bytearray(path.read_bytes())
            if rng.random() < 0.3:
                data = data[: rng.randrange(len(data))]
            else:
                for _ in range(rng.choice((1, 2, 4, 8))):
                    span = min(len(data), 200) if rng.random() < 0.7 else len(data)
                    data[rng.randrange(span)] = rng.randrange(256)
            for color in (True, False):
                try:
                    decode_image(bytes(data), color=color, where=path.name)
                except ImageError:
                    pass
                except Exception as exc:  # noqa: BLE001 (what the test looks for)
                    escaped.append(f"{path.name}: {type(exc).__name__}: {exc}")
        return "\n".join(escaped[:5]) or "ok"

    assert in_forked_child(work) == "ok"


@pytest.mark.parametrize("front_end", ["imageset", "convert_imageset"])
def test_an_image_no_record_can_hold_is_skipped_before_it_is_decoded(
    tmp_path: Path, front_end: str
) -> None:
    """30000 × 30000 colour is within OpenCV's limits, but its raw record (2.7 GB) is past
    protobuf's 2 GiB: skipped from its header, naming the way out (before: decoded, then
    failing on its data; a real one would have been written as a record no reader parses)."""
    (tmp_path / "imgs").mkdir()
    good_png(tmp_path / "imgs" / "good.png")
    (tmp_path / "imgs" / "wide.png").write_bytes(png_header(30000, 30000, 8, 2))
    (tmp_path / "list.txt").write_text("wide.png 0\ngood.png 1\n")
    done = run(FRONT_ENDS[front_end](), tmp_path)
    assert reasons(done) == [
        "imgs/wide.png: 3 × 30000 × 30000 is 2700000000 bytes, more than a record holds "
        "(protobuf's 2 GiB); give a resize"
    ]
    assert written(tmp_path, front_end) == 1
