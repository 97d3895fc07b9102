"""Draw images for people: as text for a terminal, or as a labelled PNG grid.

Text views take one pixel per character cell row, two characters wide (a terminal cell is
about twice as tall as it is wide), so a 28 × 28 digit keeps its proportions:

* shading (default): ``" ░▒▓█"``, darker glyph for a brighter pixel;
* ``ascii=True``: the same idea with ``" .:-=+*#%@"`` for plain terminals;
* ``threshold=T``: the seed script's 0/1 view, ``1`` where a pixel is above ``T``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mnist2db.errors import RenderError
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import AtomicFile

if TYPE_CHECKING:
    from mnist2db.storage.files import PathArg

SHADE_RAMP = " ░▒▓█"
ASCII_RAMP = " .:-=+*#%@"

#: PNG grid geometry: each pixel becomes SCALE × SCALE, cells are separated by PAD white
#: pixels, and a LABEL_HEIGHT band above each image holds its caption.
SCALE = 3
PAD = 4
LABEL_HEIGHT = 14
MAX_COLUMNS = 10
#: A 2-channel image (a siamese pair) is drawn as its channels side by side, separated by
#: PAIR_GAP columns of this grey: visible on MNIST's black background and on white.
PAIR_GAP = 1
PAIR_DIVIDER = 128
#: The largest PNG canvas drawn, in pixels (one byte each, in memory until written):
#: 1000 MNIST digits take 9 million.
MAX_PNG_PIXELS = 64_000_000
#: The largest image drawn as text, in pixels (two characters each): a 1000 × 1000 image
#: makes 1000 lines of 2000 characters, already more than any terminal shows.
MAX_TEXT_PIXELS = 1_000_000


#: The values of a float_data record ``show`` prints (the rest are counted).
VALUES_SHOWN = 64


def values_to_text(image: np.ndarray) -> str | None:
    """A float_data record's values as one line (``0.25 -3.5 17``), when it is a vector
    (``(N, 1, 1)``: a label database's record); None for an image."""
    if image.dtype == np.uint8 or image.ndim != 3 or image.shape[1:] != (1, 1):
        return None
    values = [f"{v:.7g}" for v in image.reshape(-1)[:VALUES_SHOWN].tolist()]
    more = image.shape[0] - VALUES_SHOWN
    return " ".join(values) + (f" … ({image.shape[0]} values)" if more > 0 else "")


def image_to_gray(image: np.ndarray) -> np.ndarray:
    """A ``(height, width)`` uint8 view of a ``(channels, height, width)`` image.

    One channel is taken as is; three are Caffe's BGR order, reduced to luminance; two
    (a siamese pair) are drawn side by side, ``width`` apart plus a :data:`PAIR_GAP`-pixel
    grey divider, so a drawn pair is ``2 * width + PAIR_GAP`` wide.

    Raises:
        RenderError: another number of channels, or a non-uint8 image.
    """
    if image.ndim != 3:
        raise RenderError(f"cannot draw an array of shape {image.shape}: expected (c, h, w)")
    if image.dtype != np.uint8:
        if values_to_text(image) is not None:
            raise RenderError(
                f"holds {image.shape[0]} float_data values (a label database's record), "
                "not an image: show prints them without --png"
            )
        raise RenderError(f"cannot draw {image.dtype} pixels: expected uint8")
    if image.shape[0] == 1:
        gray: np.ndarray = image[0]
        return gray
    if image.shape[0] == 3:
        blue, green, red = (image[i].astype(np.float32) for i in range(3))
        gray = np.rint(0.299 * red + 0.587 * green + 0.114 * blue).astype(np.uint8)
        return gray
    if image.shape[0] == 2:
        divider = np.full((image.shape[1], PAIR_GAP), PAIR_DIVIDER, dtype=np.uint8)
        gray = np.concatenate([image[0], divider, image[1]], axis=1)
        return gray
    raise RenderError(f"cannot draw an image with {image.shape[0]} channels (expected 1, 2 or 3)")


def drawn_size(image: np.ndarray) -> tuple[int, int]:
    """``(height, width)`` of ``image`` as drawn (a pair is drawn twice as wide, see
    :func:`image_to_gray`), known before drawing it.

    Raises:
        RenderError: as :func:`image_to_gray`.
    """
    image_to_gray(image)  # refuses what cannot be drawn
    return drawn_shape(*image.shape)


def drawn_shape(channels: int, height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` an image of this shape is drawn at, known before it is read: a
    pair (2 channels) side by side, ``2 * width + PAIR_GAP`` wide."""
    return height, 2 * width + PAIR_GAP if channels == 2 else width


def check_text_size(where: str, height: int, width: int) -> None:
    """Refuse, before the image is read, one too large to draw as text: more than
    :data:`MAX_TEXT_PIXELS` (``height × width`` as drawn).

    Raises:
        RenderError: naming ``where``, the size and what to do instead.
    """
    if height * width > MAX_TEXT_PIXELS:
        raise RenderError(
            f"{where}: a {height} × {width} image is too large to draw as text (more than "
            f"{MAX_TEXT_PIXELS} pixels; write it with --png, or look at it with another tool)"
        )


def image_to_text(
    image: np.ndarray, *, threshold: int | None = None, ascii: bool = False
) -> list[str]:
    """The lines that draw ``image`` (``(channels, height, width)`` uint8) in a terminal.

    Args:
        threshold: draw ``1`` where a pixel is greater than this and ``0`` elsewhere,
            digits separated by spaces, as the seed script prints.
        ascii: use printable ASCII instead of Unicode shading.
    """
    gray = image_to_gray(image)
    if threshold is not None:
        bits = (gray > threshold).astype(np.uint8)
        return [" ".join("01"[b] for b in row) for row in bits.tolist()]
    ramp = ASCII_RAMP if ascii else SHADE_RAMP
    levels = (gray.astype(np.uint16) * len(ramp)) >> 8
    return ["".join(ramp[v] * 2 for v in row).rstrip() for row in levels.tolist()]


def grid_layout(count: int, height: int, width: int) -> tuple[int, int, int, int]:
    """``(columns, rows, png_width, png_height)`` of the grid for ``count`` images."""
    columns = min(count, max(5, math.ceil(math.sqrt(count))), MAX_COLUMNS)
    columns = max(columns, 1)
    rows = max(1, math.ceil(count / columns))
    cell_w = width * SCALE
    cell_h = LABEL_HEIGHT + height * SCALE
    return columns, rows, columns * cell_w + (columns + 1) * PAD, rows * cell_h + (rows + 1) * PAD


def check_canvas(path: str, count: int, height: int, width: int) -> None:
    """Refuse, before any image is held, a grid whose canvas exceeds :data:`MAX_PNG_PIXELS`.

    Raises:
        RenderError: naming the size and what fits.
    """
    _, _, png_w, png_h = grid_layout(count, height, width)
    if png_w * png_h > MAX_PNG_PIXELS:
        low, high = 0, count  # the most images that fit: the canvas grows with the count
        while low < high:
            middle = (low + high + 1) // 2
            _, _, w, h = grid_layout(middle, height, width)
            low, high = (middle, high) if w * h <= MAX_PNG_PIXELS else (low, middle - 1)
        fits = low
        hint = f"use --count {fits} or fewer" if fits else "one image is already too large"
        raise RenderError(
            f"{path}: {count} images of {height} × {width} make a {png_w} × {png_h} canvas, "
            f"more than {MAX_PNG_PIXELS} pixels ({hint})"
        )


def size_check(source: str, png: str | None) -> Callable[[int, int, int, int, int], None]:
    """What ``show`` checks of each record's declared size before reading it (for
    :func:`mnist2db.show.select_records`): the PNG grid's canvas (``png``), or the size of
    a drawing in text.

    The check is called as ``check(index, selected, channels, height, width)``.
    """

    def check(index: int, selected: int, channels: int, height: int, width: int) -> None:
        drawn = drawn_shape(channels, height, width)
        if png is not None:
            check_canvas(png, selected, *drawn)
        else:
            check_text_size(f"{source}: record {index}", *drawn)

    return check


def cell_origin(position: int, columns: int, height: int, width: int) -> tuple[int, int]:
    """Top-left corner ``(x, y)`` of the image (below its caption) in grid cell ``position``."""
    row, column = divmod(position, columns)
    x = PAD + column * (width * SCALE + PAD)
    y = PAD + row * (LABEL_HEIGHT + height * SCALE + PAD) + LABEL_HEIGHT
    return x, y


def write_png_grid(
    images: Sequence[np.ndarray],
    captions: Sequence[str],
    path: PathArg,
    *,
    overwrite: bool = False,
    inputs: Sequence[PathArg | None] = (),
) -> tuple[int, int]:
    """Write ``images`` (each ``(channels, height, width)`` uint8, one shape) as a PNG grid,
    each under its caption; white background, pixels as stored (MNIST: white on black).

    The file is written beside ``path`` under a temporary name and renamed when complete.

    ``inputs``: the files and databases the images were read from: ``path`` may be none of
    them, nor inside one.

    Returns:
        The PNG's ``(width, height)``.

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is false, is not a file, or is
            (or is inside) one of ``inputs``.
        RenderError: no images, images of different shapes, a canvas larger than
            :data:`MAX_PNG_PIXELS`, too little memory, or the file cannot be written.
    """
    out = os.fsdecode(path)
    if not images:
        raise RenderError(f"{out}: no images to draw")
    check_file_target(out, overwrite, [os.fsdecode(i) for i in inputs if i is not None])
    grays = [image_to_gray(image) for image in images]
    height, width = grays[0].shape
    for gray in grays:
        if gray.shape != (height, width):
            raise RenderError(
                f"{out}: images of different sizes ({height} × {width} and "
                f"{gray.shape[0]} × {gray.shape[1]}) cannot share a grid"
            )
    check_canvas(out, len(grays), height, width)
    columns, _, png_w, png_h = grid_layout(len(grays), height, width)
    try:
        canvas = Image.new("L", (png_w, png_h), color=255)
        draw = ImageDraw.Draw(canvas)
        font = ImageFont.load_default()
        block = np.ones((SCALE, SCALE), dtype=np.uint8)
        for position, (gray, caption) in enumerate(zip(grays, captions, strict=True)):
            x, y = cell_origin(position, columns, height, width)
            canvas.paste(Image.fromarray(np.kron(gray, block)), (x, y))
            text = caption
            while text and draw.textlength(text, font=font) > width * SCALE:
                text = text[1:]
            draw.text((x, y - LABEL_HEIGHT + 1), text, fill=0, font=font)
    except MemoryError:
        raise RenderError(f"{out}: not enough memory to draw a {png_w} × {png_h} canvas") from None
    try:
        with AtomicFile(out, suffix=".png") as target:
            canvas.save(target.stream, format="PNG")
            target.commit()
    except MemoryError:
        raise RenderError(f"{out}: not enough memory to encode the PNG") from None
    except OSError as exc:
        raise RenderError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return png_w, png_h
