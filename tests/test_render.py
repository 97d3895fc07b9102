"""render: images as terminal text and as a labelled PNG grid (the ``show`` command's drawing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mnist2db.errors import OutputExistsError, RenderError
from mnist2db.render import (
    LABEL_HEIGHT,
    MAX_PNG_PIXELS,
    PAD,
    SCALE,
    SHADE_RAMP,
    cell_origin,
    check_canvas,
    drawn_size,
    grid_layout,
    image_to_gray,
    image_to_text,
    write_png_grid,
)


def test_shading_structure() -> None:
    gradient = np.array([[[0, 60, 120, 180, 250, 255, 51, 52]]], dtype=np.uint8)
    assert image_to_text(gradient) == ["  ░░▒▒▓▓████  ░░"]
    assert image_to_text(gradient, ascii=True) == ["  ::==##@@@@..::"]


def test_shading_of_a_digit_keeps_its_shape(mnist_pair) -> None:
    _, _, images, _ = mnist_pair(1, 28, 28)
    image = images[0].copy()
    image[:, :] = 0
    image[4:24, 13:15] = 255  # a vertical bar: the digit 1
    lines = image_to_text(image[None])
    assert len(lines) == 28
    assert all(line == "" for line in lines[:4] + lines[24:])
    assert all(line == " " * 26 + "█" * 4 for line in lines[4:24])
    assert set("".join(lines)) <= set(SHADE_RAMP)


def test_three_channels_are_bgr_reduced_to_luminance() -> None:
    image = np.zeros((3, 1, 3), dtype=np.uint8)
    image[0, 0, 0] = 255  # blue
    image[1, 0, 1] = 255  # green
    image[2, 0, 2] = 255  # red
    assert image_to_gray(image).tolist() == [[29, 150, 76]]


def test_two_channels_are_drawn_side_by_side() -> None:
    # A siamese pair: channel 0 on the left, channel 1 on the right, a grey column between.
    image = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], dtype=np.uint8)
    assert image_to_gray(image).tolist() == [[1, 2, 128, 5, 6], [3, 4, 128, 7, 8]]
    assert drawn_size(np.zeros((2, 28, 28), dtype=np.uint8)) == (28, 57)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (
            np.zeros((4, 3, 3), dtype=np.uint8),
            "cannot draw an image with 4 channels (expected 1, 2 or 3)",
        ),
        (np.zeros((1, 3, 3), dtype=np.float64), "cannot draw float64 pixels: expected uint8"),
        (
            np.zeros((3, 3), dtype=np.uint8),
            "cannot draw an array of shape (3, 3): expected (c, h, w)",
        ),
    ],
)
def test_what_cannot_be_drawn_is_named(image: np.ndarray, message: str) -> None:
    with pytest.raises(RenderError) as caught:
        image_to_gray(image)
    assert str(caught.value) == message


def test_grid_layout_and_cells() -> None:
    # 12 images: ceil(sqrt(12)) = 4 < 5, so 5 columns and 3 rows.
    cell_w, cell_h = 28 * SCALE, LABEL_HEIGHT + 28 * SCALE
    assert grid_layout(12, 28, 28) == (5, 3, 5 * cell_w + 6 * PAD, 3 * cell_h + 4 * PAD)
    assert grid_layout(1, 28, 28)[:2] == (1, 1)
    assert grid_layout(1000, 28, 28)[:2] == (10, 100)
    assert cell_origin(0, 5, 28, 28) == (PAD, PAD + LABEL_HEIGHT)
    assert cell_origin(6, 5, 28, 28) == (2 * PAD + cell_w, 2 * PAD + cell_h + LABEL_HEIGHT)


def test_check_canvas_names_what_fits() -> None:
    check_canvas("grid.png", 1000, 28, 28)  # 9 million pixels: drawn
    with pytest.raises(RenderError) as caught:
        check_canvas("grid.png", 100_000, 28, 28)
    message = str(caught.value)
    assert message.startswith("grid.png: 100000 images of 28 × 28 make a ")
    assert f"more than {MAX_PNG_PIXELS} pixels (use --count " in message
    fits = int(message.split("use --count ")[1].split()[0])
    _, _, w, h = grid_layout(fits, 28, 28)
    assert w * h <= MAX_PNG_PIXELS
    _, _, w, h = grid_layout(fits + 1, 28, 28)
    assert w * h > MAX_PNG_PIXELS


def test_png_grid_holds_each_image_scaled(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (1, 4, 5), dtype=np.uint8) for _ in range(7)]
    out = tmp_path / "grid.png"
    size = write_png_grid(images, [f"#{i}" for i in range(7)], out)
    with Image.open(out) as png:
        assert png.size == size == grid_layout(7, 4, 5)[2:]
        pixels = np.asarray(png.convert("L"))
    columns = grid_layout(7, 4, 5)[0]
    for position, image in enumerate(images):
        x, y = cell_origin(position, columns, 4, 5)
        drawn = pixels[y : y + 4 * SCALE, x : x + 5 * SCALE]
        assert (drawn == np.kron(image[0], np.ones((SCALE, SCALE), dtype=np.uint8))).all()


def test_png_grid_refuses_mixed_sizes_and_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    a, b = np.zeros((1, 4, 4), dtype=np.uint8), np.zeros((1, 5, 4), dtype=np.uint8)
    with pytest.raises(RenderError, match=r"images of different sizes \(4 × 4 and 5 × 4\)"):
        write_png_grid([a, b], ["a", "b"], out)
    assert not out.exists()
    out.write_bytes(b"mine")
    with pytest.raises(OutputExistsError):
        write_png_grid([a], ["a"], out)
    assert out.read_bytes() == b"mine"
