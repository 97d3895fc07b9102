"""Encoded Datums: ``--encoded png`` records, and every reader decoding them."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import fashion_file, make_images
from PIL import Image

import mnist2db
from mnist2db.formats.datum.message import datum_to_array, decode_datum
from mnist2db.formats.png.encoder import encode_png, encode_png_batch, is_png
from mnist2db.recipe import read_metadata
from mnist2db.storage.databases.backends import METADATA_NAME
from mnist2db.storage.databases.readers import open_reader

Pair = Callable[..., tuple[Path, Path, np.ndarray, np.ndarray]]
BACKENDS = ["lmdb", "leveldb"]


def records(db: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(str(db)) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


def pillow_pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        assert image.mode == "L"
        return np.asarray(image)


def run(*args: str) -> Any:
    from click.testing import CliRunner

    from mnist2db.cli.app import cli

    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("compression", ["fast", "small"])
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 5), (28, 28), (200, 7), (400, 300)])
def test_batch_encodes_real_datums_whose_png_holds_the_pixels(
    rows: int, cols: int, compression: str
) -> None:
    images = make_images(6, rows, cols, seed=rows)
    images[2] = 0  # long runs
    labels = np.array([0, 9, 127, 128, 300, -3])
    values = encode_png_batch(images, labels, compression)
    assert len(values) == 6
    for value, image, label in zip(values, images, labels, strict=True):
        datum = decode_datum(value)
        # Exactly protobuf's serialization of the same fields.
        assert datum.SerializeToString() == value
        assert datum.encoded is True
        assert (datum.channels, datum.height, datum.width) == (1, rows, cols)
        assert datum.label == label and not len(datum.float_data)
        assert is_png(datum.data) and datum.data == encode_png(image, compression)
        np.testing.assert_array_equal(pillow_pixels(datum.data), image)
        decoded = datum_to_array(datum)  # decodes, unlike pycaffe's datum_to_array
        assert decoded.shape == (1, rows, cols) and decoded.dtype == np.uint8
        np.testing.assert_array_equal(decoded[0], image)
    assert encode_png_batch(images[:0], labels[:0], compression) == []


_CV2_SCRIPT = """
import sys, numpy as np, cv2
data = open(sys.argv[1], "rb").read()
out = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
sys.stdout.write(f"{out.shape} {out.dtype}\\n")
sys.stdout.buffer.write(out.tobytes())
"""


def _system_cv2() -> str | None:
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        return None
    found = subprocess.run([python, "-c", "import cv2"], capture_output=True, check=False)
    return python if found.returncode == 0 else None


def test_opencv_decodes_the_png_natively_to_the_pixels(tmp_path: Path) -> None:
    """Caffe's DataTransformer: cv::imdecode(..., IMREAD_UNCHANGED) — grey stays 1 channel."""
    python = _system_cv2()
    if python is None:
        pytest.skip("no OpenCV for /usr/bin/python3 (apt-get install python3-opencv)")
    image = make_images(1, 9, 13, seed=5)[0]
    png = tmp_path / "x.png"
    png.write_bytes(decode_datum(encode_png_batch(image[None], np.array([1])).pop()).data)
    out = subprocess.run(
        [python, "-c", _CV2_SCRIPT, str(png)], capture_output=True, check=True
    ).stdout
    head, _, pixels = out.partition(b"\n")
    assert head == b"(9, 13) uint8"  # two dimensions: one channel
    assert pixels == image.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoded_database_round_trips_through_every_reader(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    from mnist2db.exporting.to_idx import export_db
    from mnist2db.info import db_info
    from mnist2db.mean import compute_mean
    from mnist2db.verify import verify_db

    images_path, labels_path, images, labels = mnist_pair(1030, rows=5, cols=7)
    png_db, raw_db = tmp_path / "png", tmp_path / "raw"
    result = mnist2db.convert(images_path, labels_path, png_db, backend, encoded="png")
    assert (result.count, result.rows, result.cols) == (1030, 5, 7)
    mnist2db.convert(images_path, labels_path, raw_db, backend)
    stored = records(png_db)
    assert [k for k, _ in stored] == [b"%08d" % i for i in range(1030)]
    for (_, value), image, label in zip(stored, images, labels, strict=True):
        datum = decode_datum(value)
        assert datum.encoded and datum.label == label
        np.testing.assert_array_equal(pillow_pixels(datum.data), image)
    found = read_metadata(png_db)
    assert found is not None and found[0].encoded == "png"
    assert found[1]["encoded"] == "png"
    # open_db: the decoded pixels, as for the raw database.
    with mnist2db.open_db(png_db) as db:
        image, label = db[1029]
        assert image.shape == (1, 5, 7) and label == labels[1029]
        np.testing.assert_array_equal(image[0], images[1029])
        assert [int(lb) for _, lb in db] == labels.tolist()
    assert verify_db(png_db, images_path, labels_path).count == 1030
    export_db(png_db, tmp_path / "out", prefix="x")
    assert (tmp_path / "out/x-images-idx3-ubyte").read_bytes() == images_path.read_bytes()
    assert (tmp_path / "out/x-labels-idx1-ubyte").read_bytes() == labels_path.read_bytes()
    png_mean, raw_mean = compute_mean(str(png_db)), compute_mean(str(raw_db))
    np.testing.assert_array_equal(png_mean.mean, raw_mean.mean)
    info = db_info(png_db)
    assert info.encoding == "PNG-encoded image (Datum.encoded)" and info.problem is None
    assert (
        "encoded",
        "PNG images in Datum.data (encoded: true), --png-compression fast",
    ) in info.recipe


def test_same_seed_with_shuffle_gives_the_same_encoded_bytes(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    images_path, labels_path, images, _ = mnist_pair(300, rows=6, cols=4)
    for name in ("a", "b"):
        mnist2db.convert(
            images_path, labels_path, tmp_path / name, shuffle=True, seed=9, encoded="png",
            transpose=True, offset=20, count=250,
        )  # fmt: skip
    first = records(tmp_path / "a")
    assert first == records(tmp_path / "b")
    # Shuffled (not in source order), transposed, and still checked by verify.
    decoded = [pillow_pixels(decode_datum(v).data) for _, v in first]
    assert decoded[0].shape == (4, 6)
    assert [d.T.tobytes() for d in decoded] != [im.tobytes() for im in images[20:270]]
    assert {d.T.tobytes() for d in decoded} == {im.tobytes() for im in images[20:270]}
    from mnist2db.verify import verify_db

    assert verify_db(tmp_path / "a", images_path, labels_path).count == 250


def test_verify_compares_decoded_pixels(tmp_path: Path, mnist_pair: Pair) -> None:
    import lmdb

    from mnist2db.errors import VerifyError
    from mnist2db.verify import verify_db

    images_path, labels_path, images, labels = mnist_pair(12, rows=4, cols=4)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, encoded="png")

    def put(index: int, image: np.ndarray) -> None:
        datum = decode_datum(records(db)[index][1])
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG", optimize=True)  # another encoder
        datum.data = buffer.getvalue()
        with lmdb.open(str(db), subdir=True) as env, env.begin(write=True) as txn:
            txn.put(b"%08d" % index, datum.SerializeToString())

    # Other PNG bytes of the same pixels: still the source's records.
    put(3, images[3])
    assert decode_datum(records(db)[3][1]).data != encode_png(images[3])
    assert verify_db(db, images_path, labels_path).count == 12
    changed = images[7].copy()
    changed[2, 1] ^= 0xFF
    put(7, changed)
    with pytest.raises(VerifyError) as caught:
        verify_db(db, images_path, labels_path)
    assert "key 00000007: field data differs at byte 9 (row 2, column 1)" in str(caught.value)
    assert f"source {images[7][2, 1]}" in str(caught.value)


def test_cli_encoded_for_convert_and_create(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, images, _ = mnist_pair(15, rows=3, cols=3)
    out = tmp_path / "db"
    result = run("convert", "-q", "--encoded", "png", str(images_path), str(labels_path), str(out))
    assert result.exit_code == 0, result.output
    assert all(decode_datum(v).encoded for _, v in records(out))
    info = run("info", str(out))
    assert "PNG-encoded image (Datum.encoded)" in info.stdout
    assert (
        "encoded     PNG images in Datum.data (encoded: true), --png-compression fast\n"
        in info.stdout
    )
    shown = run("show", str(out), "--count", "1", "--threshold", "128")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[1:4] == [
        " ".join("1" if p >= 128 else "0" for p in row) for row in images[0]
    ]
    bad = run(
        "convert", "--encoded", "jpeg", str(images_path), str(labels_path), str(tmp_path / "x")
    )
    assert bad.exit_code == 2 and "'jpeg' is not" in bad.stderr
    data = tmp_path / "data"
    data.mkdir()
    for stem, split in (("train", "train"), ("t10k", "test")):
        paths = mnist_pair(10, rows=2, cols=2, stem=stem, seed=len(split))
        os.replace(paths[0], data / paths[0].name)
        os.replace(paths[1], data / paths[1].name)
    made = run(
        "create", "-q", "--data", str(data), "--out", str(tmp_path / "ex"), "--encoded", "png"
    )
    assert made.exit_code == 0, made.output
    for split in ("train", "test"):
        db = tmp_path / "ex" / f"mnist_{split}_lmdb"
        assert (db / METADATA_NAME).exists()
        assert all(decode_datum(v).encoded for _, v in records(db))


def test_library_refuses_an_unknown_encoding(tmp_path: Path, mnist_pair: Pair) -> None:
    from mnist2db.errors import Mnist2dbError

    images_path, labels_path, _, _ = mnist_pair(3)
    with pytest.raises(Mnist2dbError, match=r"^unknown encoding 'gif': expected one of png"):
        mnist2db.convert(images_path, labels_path, tmp_path / "db", encoded="gif")
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fashion_test_set_png_round_trip(tmp_path: Path, backend: str) -> None:
    import gzip

    from db_helpers import record_digest

    from mnist2db.exporting.to_idx import export_db
    from mnist2db.verify import verify_db

    images = fashion_file("t10k-images-idx3-ubyte.gz")
    labels = fashion_file("t10k-labels-idx1-ubyte.gz")
    db = tmp_path / "db"
    mnist2db.convert(images, labels, db, backend, encoded="png")
    # The "fast" records are a function of the images alone: pinned, whatever zlib.
    assert record_digest(db) == (10000, FASHION_TEST_PNG_DIGEST)
    assert verify_db(db, images, labels).count == 10000
    export_db(db, tmp_path / "out", prefix="t")
    for path, kind in ((images, "images-idx3"), (labels, "labels-idx1")):
        exported = (tmp_path / f"out/t-{kind}-ubyte").read_bytes()
        assert exported == gzip.decompress(path.read_bytes())


FASHION_TEST_PNG_DIGEST = "ff6e5852cd17ad9ae908375c58e9dbb548b758025674937bd1150840243c286d"


def test_the_png_bytes_are_pinned() -> None:
    """The "small" encoder's bytes for one image: a zlib that compresses otherwise (another
    version, zlib-ng) fails here, before any database of it differs from ours. (On so small
    an image zlib chooses fixed codes, and its bytes are the "fast" encoder's.)"""
    image = (np.arange(20, dtype=np.uint8).reshape(4, 5) * 13) % 7 * 30
    assert encode_png(image, "small").hex() == PINNED_PNG
    assert encode_png(image, "fast").hex() == PINNED_PNG


PINNED_PNG = "89504e470d0a1a0a0000000d49484452000000050000000408000000006358aa9c000000204944415478016360d832ad228ac1468e61cb34868a281b3906862dd32aa26c00572a07457cf041a90000000049454e44ae426082"


def test_the_two_compressions_differ_where_zlib_builds_its_own_codes() -> None:
    """Both pinned: "small" depends on zlib's version, "fast" on nothing but the image."""
    image = np.zeros((20, 30), np.uint8)
    image[5:15, 10:20] = 255
    image[8, :] = np.arange(30)
    small, fast = encode_png(image, "small"), encode_png(image, "fast")
    assert small.hex() == PINNED_SMALL and fast.hex() == PINNED_FAST
    assert encode_png(image) == fast  # the default
    for png in (small, fast):
        np.testing.assert_array_equal(pillow_pixels(png), image)


PINNED_SMALL = "89504e470d0a1a0a0000000d494844520000001e000000140800000000bfc0d2180000004a494441547801d5c1b7018340000340114cce196cf61f5374328516f83b0481028702878297284ed24f96176555376dd70fe3342febb61fe7f5fdddf8a3c0a1c0a1c0a1c0a1c0a120040f1da25b5a220334be0000000049454e44ae426082"
PINNED_FAST = "89504e470d0a1a0a0000000d494844520000001e000000140800000000bfc0d2180000005b494441547801631812e03f1c306003ffe180011bf80f070c488091899985958d9d83938b9b87978f5f4050485844544c5c42524a5a46960101fec3010336f01f0e18b081ff70c0800dfc8703066ce03f1c306003ffe180612800001da25b5af9a98f8c0000000049454e44ae426082"


@pytest.mark.parametrize("compression", ["fast", "small"])
def test_records_are_the_same_bytes_on_one_thread_and_on_several(
    tmp_path: Path, compression: str
) -> None:
    """Threads compress the images; a process confined to one processor uses none."""
    import hashlib
    import sys

    images = make_images(3000, 9, 11, seed=4)
    images[::3, 2:] = 0  # runs, some across rows
    labels = np.arange(3000) % 300 - 20
    digest = hashlib.sha256(b"".join(encode_png_batch(images, labels, compression))).hexdigest()
    np.save(tmp_path / "images.npy", images)
    script = (
        "import hashlib, os, sys, numpy as np\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from mnist2db.formats.png.encoder import encode_png_batch\n"
        "images = np.load(sys.argv[1])\n"
        "labels = np.arange(3000) % 300 - 20\n"
        f"values = encode_png_batch(images, labels, {compression!r})\n"
        "print(hashlib.sha256(b''.join(values)).hexdigest())\n"
    )
    alone = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "images.npy")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert alone == digest
    # Each record also equals the image encoded alone, and batches of any size agree.
    values = encode_png_batch(images[:200], labels[:200], compression)
    assert [decode_datum(v).data for v in values] == [
        encode_png(im, compression) for im in images[:200]
    ]
    for size in (1, 64, 199):
        parts = [
            encode_png_batch(
                images[i : min(200, i + size)], labels[i : min(200, i + size)], compression
            )
            for i in range(0, 200, size)
        ]
        assert sum(parts, []) == values


@pytest.mark.parametrize(("rows", "cols"), [(0, 5), (4, 0)])
def test_images_with_a_side_of_0_are_refused_before_any_work(
    tmp_path: Path, mnist_pair: Pair, rows: int, cols: int
) -> None:
    images_path, labels_path, _, _ = mnist_pair(3, rows=rows, cols=cols)
    out = tmp_path / "db"
    result = run("convert", "--encoded", "png", str(images_path), str(labels_path), str(out))
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {images_path}: images of {rows}x{cols} pixels cannot be PNG-encoded: "
        "a PNG's sides are 1 to 2^31-1 pixels\n"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [images_path.name, labels_path.name]
    )
    from mnist2db.errors import DatumError

    with pytest.raises(DatumError, match="cannot be PNG-encoded"):
        encode_png_batch(np.zeros((2, rows, cols), np.uint8), np.zeros(2, np.int64))
