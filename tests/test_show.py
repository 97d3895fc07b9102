"""mnist2db show: terminal views (0/1, shading, ASCII), the PNG grid, and its error lines."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx
from PIL import Image

from mnist2db import convert
from mnist2db.cli.app import cli
from mnist2db.render import SHADE_RAMP

#: Three 4 × 5 images whose 0/1 view at threshold 10 is known by heart.
TINY = np.array(
    [
        [[0, 200, 0, 11, 0], [10, 11, 255, 0, 0], [0, 0, 0, 0, 9], [1, 2, 3, 4, 5]],
        [[255] * 5, [0] * 5, [11] * 5, [10] * 5],
        [[0, 0, 0, 0, 0], [0, 90, 90, 90, 0], [0, 90, 0, 90, 0], [0, 90, 90, 90, 0]],
    ],
    dtype=np.uint8,
)
TINY_LABELS = np.array([3, 5, 0], dtype=np.uint8)

TINY_THRESHOLD_10 = """\
#0  label 3
0 1 0 1 0
0 1 1 0 0
0 0 0 0 0
0 0 0 0 0

#1  label 5
1 1 1 1 1
0 0 0 0 0
1 1 1 1 1
0 0 0 0 0

#2  label 0
0 0 0 0 0
0 1 1 1 0
0 1 0 1 0
0 1 1 1 0

"""


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    images = write_idx(tmp_path / "tiny-images-idx3-ubyte", TINY)
    labels = write_idx(tmp_path / "tiny-labels-idx1-ubyte", TINY_LABELS)
    return images, labels


def test_threshold_view_exact(tiny: tuple[Path, Path]) -> None:
    images, labels = tiny
    result = run("show", images, "--labels", labels, "--threshold", 10)
    assert result.exit_code == 0, result.output
    assert result.stdout == TINY_THRESHOLD_10
    assert result.stderr == "Showed 3 of 10 requested: " + f"{images} ends at 3 records.\n"


def test_labels_found_beside_the_images(tiny: tuple[Path, Path]) -> None:
    images, _ = tiny
    result = run("show", images, "--threshold", 10, "--count", 3)
    assert result.exit_code == 0, result.output
    assert result.stdout == TINY_THRESHOLD_10
    assert result.stderr == ""


def test_gzip_labels_found_beside_gzip_images(tmp_path: Path) -> None:
    images = write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", TINY, gz=True)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", TINY_LABELS, gz=True)
    result = run("show", images, "--threshold", 10, "--offset", 2, "--count", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout == TINY_THRESHOLD_10.split("\n\n")[2] + "\n\n"


def test_without_labels_the_label_is_a_dash(tmp_path: Path) -> None:
    images = write_idx(tmp_path / "digits.idx3", TINY)
    result = run("show", images, "--threshold", 100, "--count", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == ["#0  label -", "0 1 0 0 0", "0 0 1 0 0"]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_database_source_shows_keys(tiny: tuple[Path, Path], tmp_path: Path, backend: str) -> None:
    images, labels = tiny
    db = tmp_path / f"tiny_{backend}"
    convert(images, labels, db, backend=backend)
    result = run("show", db, "--offset", 1, "--count", 2, "--threshold", 10)
    assert result.exit_code == 0, result.output
    expected = TINY_THRESHOLD_10.split("\n\n")[1:3]
    expected[0] = expected[0].replace("#1  label 5", "#1  key 00000001  label 5")
    expected[1] = expected[1].replace("#2  label 0", "#2  key 00000002  label 0")
    assert result.stdout == "\n\n".join(expected) + "\n\n"


def test_shading_via_cli_for_a_random_image(mnist_pair) -> None:
    images_path, _, images, labels = mnist_pair(3, 28, 28)
    result = run("show", images_path, "--offset", 2, "--count", 1)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"#2  label {labels[2]}"
    assert len(lines) == 1 + 28 + 1 and lines[-1] == ""
    for row, line in zip(images[2], lines[1:29], strict=True):
        expected = "".join(SHADE_RAMP[v * 5 >> 8] * 2 for v in row.tolist()).rstrip()
        assert line == expected


def test_png_grid(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    images, labels = tiny
    out = tmp_path / "grid.png"
    result = run("show", images, "--png", out)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == f"Wrote {out}: 3 images, 61 × 34 pixels."
    with Image.open(out) as png:
        assert png.format == "PNG"
        assert png.size == (61, 34)
        pixels = np.asarray(png.convert("L"))
    # Image 1 (all 255, then 0, 11, 10 rows) sits in the second cell: x 23..37, y 18..29,
    # each pixel drawn 3 × 3.
    assert np.array_equal(pixels[18:30, 23:38], np.kron(TINY[1], np.ones((3, 3), np.uint8)))
    assert np.array_equal(pixels[18:30, 4:19], np.kron(TINY[0], np.ones((3, 3), np.uint8)))
    # The caption band above it holds dark text on white; the margins stay white.
    assert pixels[4:18, 23:38].min() < 100
    assert pixels[4:18, 23:38].max() == 255
    assert (pixels[:4, :] == 255).all()
    assert (pixels[:, 19:23] == 255).all()


def test_png_refuses_to_replace_a_file(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    images, _ = tiny
    out = tmp_path / "grid.png"
    out.write_bytes(b"mine")
    result = run("show", images, "--png", out)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {out}: already exists (use --overwrite to replace it)\n"
    assert out.read_bytes() == b"mine"
    result = run("show", images, "--png", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["grid.png", "tiny-images-idx3-ubyte", "tiny-labels-idx1-ubyte"]
    )


def test_offset_past_the_end(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    images, labels = tiny
    result = run("show", images, "--offset", 3)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"Error: {images}: offset 3 is past the end (3 images)\n"
    db = tmp_path / "tiny_lmdb"
    convert(images, labels, db)
    result = run("show", db, "--offset", 7, "--png", tmp_path / "x.png")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {db}: offset 7 is past the end (3 records)\n"
    assert not (tmp_path / "x.png").exists()


def test_non_uint8_idx(tmp_path: Path) -> None:
    floats = write_idx(tmp_path / "floats-idx3", np.zeros((2, 3, 4), dtype=">f4"))
    result = run("show", floats)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {floats}: cannot show 2 × 3 × 4 float32 data: expected uint8 images "
        "(magic 0x00000803, count × rows × cols), found magic 0x00000d03\n"
    )


def test_label_file_given_as_images(tiny: tuple[Path, Path]) -> None:
    _, labels = tiny
    result = run("show", labels)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {labels}: cannot show 3 uint8 data: expected uint8 images "
        "(magic 0x00000803, count × rows × cols), found magic 0x00000801\n"
    )


def test_mismatched_label_count(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    images, _ = tiny
    short = write_idx(tmp_path / "short-labels", TINY_LABELS[:2])
    result = run("show", images, "--labels", short)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {images}: 3 images, but {short} has 2 labels\n"


def test_not_a_database_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run("show", tmp_path / "empty")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'empty'}: neither an LMDB (no data.mdb) nor a LevelDB "
        "(no CURRENT) database\n"
    )
    result = run("show", tmp_path / "nothing")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path / 'nothing'}: no such file\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--png", "x.png", "--threshold", "3"], "--png draws images itself"),
        (["--png", "x.png", "--ascii"], "--png draws images itself"),
        (["--threshold", "256"], "256 is not in the range 0<=x<=255"),
        (["--count", "0"], "0 is not in the range x>=1"),
        (["--offset", "-1"], "-1 is not in the range x>=0"),
    ],
)
def test_usage_errors(tiny: tuple[Path, Path], args: list[str], message: str) -> None:
    images, _ = tiny
    result = run("show", images, *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_labels_option_with_a_database(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    images, labels = tiny
    db = tmp_path / "tiny_lmdb"
    convert(images, labels, db)
    result = run("show", db, "--labels", labels)
    assert result.exit_code == 2
    assert "--labels is for an IDX image file" in result.stderr
    # Silently ignored, --label-column 2 would suggest the labels shown are column 2's.
    column = run("show", db, "--label-column", "2")
    assert column.exit_code == 2
    assert column.stderr.endswith(
        "Error: --label-column picks a column of an idx2-int label file; a database holds "
        "its labels\n"
    )


@pytest.mark.parametrize("png", [False, True])
def test_float_database_cannot_be_drawn(tmp_path: Path, png: bool) -> None:
    import lmdb

    from mnist2db import array_to_datum

    db = tmp_path / "float_lmdb"
    env = lmdb.open(str(db), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"00000000", array_to_datum(np.zeros((1, 2, 2), np.float32), 1).SerializeToString())
    env.close()
    result = run("show", db, *(["--png", tmp_path / "f.png"] if png else []))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"Error: {db}: record 0: cannot draw float64 pixels: expected uint8\n"
    assert not (tmp_path / "f.png").exists()


def test_png_canvas_is_bounded_in_pixels_not_images(tmp_path: Path) -> None:
    """40 images of 3000 × 3000 are drawn within the cap, not a MemoryError traceback."""
    from helpers import write_idx

    from mnist2db.render import MAX_PNG_PIXELS

    images = np.zeros((40, 3000, 3000), np.uint8)
    path = write_idx(tmp_path / "huge-images-idx3-ubyte", images)
    del images
    result = run("show", path, "--count", 40, "--png", tmp_path / "p.png")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'p.png'}: 40 images of 3000 × 3000 make a 63032 × 54112 canvas, "
        f"more than {MAX_PNG_PIXELS} pixels (one image is already too large)\n"
    )
    assert not (tmp_path / "p.png").exists()


def test_png_of_many_small_images_is_allowed(tmp_path: Path) -> None:
    """2000 images of 8 × 8 is a small canvas: no image count limit."""
    from helpers import make_labels, write_idx

    images = write_idx(tmp_path / "s-images-idx3-ubyte", np.zeros((2000, 8, 8), np.uint8))
    write_idx(tmp_path / "s-labels-idx1-ubyte", make_labels(2000))
    result = run("show", images, "--count", 2000, "--png", tmp_path / "s.png")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"Wrote {tmp_path / 's.png'}: 2000 images, 284 × 8404 pixels.\n"
    many = write_idx(tmp_path / "m-images-idx3-ubyte", np.zeros((6000, 100, 100), np.uint8))
    result = run("show", many, "--count", 6000, "--png", tmp_path / "m.png")
    assert result.exit_code == 1
    assert result.stderr.endswith("(use --count 660 or fewer)\n"), result.stderr
    assert not (tmp_path / "m.png").exists()


@pytest.mark.parametrize("kind", ["directory", "dangling link"])
def test_png_target_that_is_not_a_file_is_refused_first(
    tiny: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    images, _ = tiny
    png = tmp_path / "out.png"
    if kind == "directory":
        png.mkdir()
        result = run("show", images, "--png", png, "--overwrite")
        assert result.exit_code == 2 and "is a directory" in result.stderr
        assert png.is_dir()
        return
    png.symlink_to(tmp_path / "nowhere")
    message = (
        f"{png}: is a symbolic link (to {tmp_path / 'nowhere'}, which does not exist); "
        "mnist2db never replaces a link, even with --overwrite: remove it or choose "
        "another name"
    )
    result = run("show", images, "--png", png, "--overwrite")
    assert (result.exit_code, result.stderr) == (1, f"Error: {message}\n")
    assert png.is_symlink()


def test_threshold_and_ascii_do_not_combine(tiny: tuple[Path, Path]) -> None:
    """--ascii beside --threshold is not silently ignored."""
    images, _ = tiny
    result = run("show", images, "--threshold", 10, "--ascii")
    assert result.exit_code == 2
    assert "--threshold prints 0/1 digits: it does not combine with --ascii" in result.stderr


def test_png_never_replaces_an_input(tiny: tuple[Path, Path]) -> None:
    images, labels = tiny
    before = images.read_bytes(), labels.read_bytes()
    for target in (images, labels):
        result = run("show", images, "--labels", labels, "--png", target, "--overwrite")
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: {target}: is the input {target}; refusing to replace it\n"
        )
    assert (images.read_bytes(), labels.read_bytes()) == before


def test_a_siamese_pair_database_is_shown_side_by_side(tmp_path: Path) -> None:
    from mnist2db.siamese import convert_siamese

    images = np.zeros((4, 3, 2), dtype=np.uint8)
    for i in range(4):
        images[i, 0, 0] = 255 if i % 2 else 0  # odd items: top-left pixel on
    ipath = write_idx(tmp_path / "p-images-idx3-ubyte", images)
    lpath = write_idx(tmp_path / "p-labels-idx1-ubyte", np.array([1, 1, 2, 2], dtype=np.uint8))
    db = tmp_path / "pairs"
    convert_siamese(ipath, lpath, db, backend="lmdb", seed=3)
    from mnist2db import open_db

    with open_db(db) as pairs:
        image, label = pairs[0]
    text = CliRunner().invoke(cli, ["show", str(db), "--count", "1", "--threshold", "10"])
    assert text.exit_code == 0, text.output
    left, right = np.asarray(image)[0], np.asarray(image)[1]
    rows = [" ".join(str(int(v > 10)) for v in [*left[r], 128, *right[r]]) for r in range(3)]
    assert text.stdout == f"#0  key 00000000  label {label}\n" + "\n".join(rows) + "\n\n"
    png = tmp_path / "pairs.png"
    drawn = CliRunner().invoke(cli, ["show", str(db), "--count", "2", "--png", str(png)])
    assert drawn.exit_code == 0, drawn.output
    one = CliRunner().invoke(
        cli, ["show", str(db), "--count", "1", "--png", str(tmp_path / "one.png")]
    )
    assert one.stderr == f"Wrote {tmp_path / 'one.png'}: 1 image, 23 × 31 pixels.\n"
    with Image.open(png) as grid:
        assert grid.size == (2 * (2 * 2 + 1) * 3 + 3 * 4, 4 * 2 + 14 + 3 * 3)


def test_png_into_a_missing_directory_is_refused_before_reading(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    images, _ = tiny
    target = tmp_path / "nodir" / "x.png"
    result = run("show", images, "--png", target)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {target}: no directory {target.parent} to write it in\n"
    assert not target.parent.exists()
