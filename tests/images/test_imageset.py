"""mnist2db imageset: class folders or a list to a database or an IDX pair; and the readers
on what convert_imageset writes (mixed encodings and sizes)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import fashion_file
from PIL import Image

from mnist2db import open_db
from mnist2db.cli.app import cli
from mnist2db.formats.lists.image_list import read_image_list
from mnist2db.imageset.to_database import write_imageset

CORPUS = Path(__file__).parents[1] / "data" / "imageset"


def run(*args: object) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def idx_array(path: Path, offset: int) -> np.ndarray:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return np.frombuffer(data, dtype=np.uint8, offset=offset)


def test_fashion_class_folders_come_back_as_their_idx(tmp_path: Path) -> None:
    """Fashion-MNIST's test set written as ROOT/<class>/<n>.png, then --to idx: the IDX
    pair holds its images and labels, in ImageFolder's order (by class, then by name)."""
    images = idx_array(fashion_file("t10k-images-idx3-ubyte"), 16).reshape(-1, 28, 28)
    labels = idx_array(fashion_file("t10k-labels-idx1-ubyte"), 8)
    root = tmp_path / "tree"
    for label in range(10):
        (root / f"class{label}").mkdir(parents=True)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image).save(root / f"class{label}" / f"{i:05d}.png", compress_level=1)
    (root / ".ipynb_checkpoints").mkdir()
    result = run("imageset", "--to", "idx", root, tmp_path / "fashion")
    assert result.exit_code == 0, result.stderr
    order = np.argsort(labels, kind="stable")
    out_images = (tmp_path / "fashion-images-idx3-ubyte").read_bytes()
    out_labels = (tmp_path / "fashion-labels-idx1-ubyte").read_bytes()
    source_head = gzip.decompress(fashion_file("t10k-images-idx3-ubyte").read_bytes())[:16]
    assert out_images[:16] == source_head
    assert out_images[16:] == images[order].tobytes()
    assert out_labels[8:] == labels[order].tobytes()
    assert "skipped 1 hidden folders and files: .ipynb_checkpoints" in result.stderr
    assert (tmp_path / "fashion.classes.txt").read_text().split() == [
        f"class{i}" for i in range(10)
    ]
    listed = list(read_image_list(tmp_path / "fashion.list.txt"))
    assert len(listed) == 10000 and listed[0].path.startswith(b"class0/")
    # The written list repeats the run.
    again = run(
        "imageset", "--to", "idx", "--list", tmp_path / "fashion.list.txt", root, tmp_path / "again"
    )
    assert again.exit_code == 0, again.stderr
    assert (tmp_path / "again-images-idx3-ubyte").read_bytes() == out_images


def test_skipped_names_holding_a_newline_or_an_escape_stay_on_their_line(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        Image.new("L", (4, 3), 7).save(root / name / "a.png")
    (root / "cat" / ".two\nlines").write_bytes(b"")
    (root / ".\x1b[31mred").mkdir()
    result = run("imageset", root, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("skipped 2 hidden"))
    assert line == "skipped 2 hidden folders and files: .\\x1b[31mred, cat/.two\\x0alines"
    assert "2 classes: cat, dog" in result.stderr.splitlines()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    rng = np.random.default_rng(1)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png"
            )
    Image.fromarray(rng.integers(0, 256, (6, 5), dtype=np.uint8)).save(root / "dog" / "x.jpg")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_class_folders_to_a_database_with_a_seed(tree: Path, tmp_path: Path) -> None:
    result = run("imageset", "--shuffle", "--seed", "7", tree, tmp_path / "db")
    assert result.exit_code == 0, result.stderr
    assert "Shuffled with seed 7 (--seed 7 repeats it)." in result.stderr
    meta = json.loads((tmp_path / "db" / "mnist2db.json").read_text())
    assert meta["imageset"]["shuffle"]["seed"] == 7 and meta["source"]["items"] == 7
    db = open_db(tmp_path / "db")
    assert len(db) == 7
    assert sorted(int(db[i][1]) for i in range(7)) == [0, 0, 0, 1, 1, 1, 1]
    again = run("imageset", "--shuffle", "--seed", "7", tree, tmp_path / "db2")
    assert again.exit_code == 0
    other = open_db(tmp_path / "db2")
    assert [db.key(i) for i in range(7)] == [other.key(i) for i in range(7)]
    assert sorted(db.key(i)[9:] for i in range(7))[0] == b"cat/0.png"
    info = run("info", tmp_path / "db")
    assert "order       shuffled, seed 7" in info.stdout


def test_idx_refuses_images_of_another_size(tree: Path, tmp_path: Path) -> None:
    Image.fromarray(np.zeros((9, 9), dtype=np.uint8)).save(tree / "cat" / "big.png")
    result = run("imageset", "--to", "idx", tree, tmp_path / "out")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tree} (class folders):4: cat/big.png is 9 × 9, the first image (cat/0.png) "
        "6 × 5 (an IDX file holds one size: give a resize)\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["tree"]
    assert run("imageset", "--to", "idx", "--resize", "4x4", tree, tmp_path / "out").exit_code == 0
    assert len((tmp_path / "out-images-idx3-ubyte").read_bytes()) == 16 + 8 * 16


def test_idx_refuses_a_label_over_255(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("cat/0.png 300\n")
    result = run("imageset", "--to", "idx", "--list", tmp_path / "list.txt", tree, tmp_path / "o")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'list.txt'}:1: label 300: an idx1 label file holds 0 … 255 "
        "(write a database instead)\n"
    )


def test_an_empty_class_folder_is_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "empty").mkdir()
    result = run("imageset", tree, tmp_path / "db")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tree / 'empty'}: class folder 'empty' holds no image (.jpg, .jpeg, .png, .ppm, "
        ".bmp, .pgm, .tif, .tiff, .webp)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "3"], "--seed orders a shuffle: add --shuffle"),
        (["--resize", "28"], "Invalid value for '--resize': '28' is not WIDTHxHEIGHT (e.g. 28x28)"),
        (["--to", "tiff"], "Invalid value for '--to'"),
    ],
)
def test_usage_errors_exit_2(tree: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = run("imageset", *args, tree, tmp_path / "db")
    assert result.exit_code == 2
    assert message in result.stderr


def test_encoded_idx_is_refused(tree: Path, tmp_path: Path) -> None:
    result = run("imageset", "--to", "idx", "--encoded", "png", tree, tmp_path / "o")
    assert result.exit_code == 1
    assert (
        result.stderr == "Error: an IDX file holds raw grey pixels: --encoded writes a database\n"
    )


def mixed_db(tmp_path: Path) -> Path:
    listing = tmp_path / "list.txt"
    listing.write_text("png_rgb.png 1\njpeg_420.jpg 2\npng_grey.png 3\n")
    out = tmp_path / "mixed"
    write_imageset(str(CORPUS / "images") + "/", lambda: read_image_list(listing), out,
                   encoded=True)  # fmt: skip
    return out


def test_readers_take_jpeg_and_png_of_several_sizes(tmp_path: Path) -> None:
    db = open_db(mixed_db(tmp_path))
    shapes = [db[i][0].shape for i in range(len(db))]
    assert shapes == [(3, 23, 31), (3, 29, 37), (1, 23, 31)]
    info = run("info", tmp_path / "mixed")
    assert info.exit_code == 0, info.stdout
    assert "3 sizes, JPEG and PNG" in info.stdout and "valid       yes" in info.stdout
    show = run("show", tmp_path / "mixed", "--ascii", "--count", "3")
    assert show.exit_code == 0 and "key 00000001_jpeg_420.jpg" in show.stdout


def test_mean_refuses_another_size_naming_the_record(tmp_path: Path) -> None:
    path = mixed_db(tmp_path)
    result = run("mean", path)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {path}: key 00000001_jpeg_420.jpg: shape 3 × 29 × 37 differs from the first "
        "record's 3 × 23 × 31\n"
    )


def test_a_mapped_file_leaves_the_resident_set(tmp_path: Path) -> None:
    """What keeps LMDB's map out of a long conversion's resident set: the pages of a mapped
    file this process touched leave it, and read the same again."""
    import mmap

    from mnist2db.imageset.to_database import release_mapped_pages

    path = tmp_path / "data.mdb"
    path.write_bytes(bytes(range(256)) * (4 << 12))  # 4 MiB

    def resident() -> int:
        with open("/proc/self/smaps") as smaps:
            lines = smaps.read().splitlines()
        for i, line in enumerate(lines):
            if line.endswith(str(path)):
                return next(int(x.split()[1]) for x in lines[i:] if x.startswith("Rss:"))
        raise AssertionError("not mapped")

    with open(path, "rb") as stream, mmap.mmap(stream.fileno(), 0, prot=mmap.PROT_READ) as view:
        assert sum(view[i] for i in range(0, len(view), 4096)) == 0  # every page touched
        assert resident() >= 4000
        release_mapped_pages(os.path.realpath(path))
        assert resident() == 0
        assert view[4097] == 1 and view[-1] == 255


@pytest.mark.parametrize("kept", [2, 1 << 16])
def test_a_list_longer_than_the_kept_entries_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: int
) -> None:
    """The writing pass takes the entries the check kept, or reads a longer list again: the
    same records either way, a skipped line's key left out."""
    from mnist2db.imageset import to_database as datum_records

    monkeypatch.setattr(datum_records, "KEPT_ENTRIES", kept)
    rng = np.random.default_rng(7)
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (6, 4), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{i}.png {i}\n" for i in range(5)) + "missing.png 9\n")
    result = write_imageset(f"{tmp_path}/", lambda: read_image_list(listing), tmp_path / "db",
                            jobs=0)  # fmt: skip
    assert (result.count, result.lines, len(result.skipped)) == (5, 6, 1)
    db = open_db(tmp_path / "db")
    assert [db.key(i) for i in range(len(db))] == [b"%08d_%d.png" % (i, i) for i in range(5)]
    assert [int(db[i][1]) for i in range(5)] == list(range(5))
    db.close()
