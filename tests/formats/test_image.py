"""Every pixel rule of mnist2db.formats.imread.reader against an independent computation (the
corpus's Caffe digests check the same images end to end)."""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from mnist2db.errors import ImageError
from mnist2db.formats.imread.imencode import encode_image
from mnist2db.formats.imread.reader import (
    decode_image,
    image_format,
    read_image,
    to_chw,
)

IMAGES = os.path.join(os.path.dirname(__file__), os.pardir, "data", "imageset", "images")


def path(name: str) -> str:
    return os.path.join(IMAGES, name)


def pillow(name: str, mode: str) -> np.ndarray:
    with Image.open(path(name)) as im:
        return np.asarray(im.convert(mode)).astype(np.int64)


def rounded_grey(rgb: np.ndarray) -> np.ndarray:
    """OpenCV's icvCvt_BGR2Gray_8u: 0.299/0.587/0.114 in 14-bit fixed point, rounded."""
    r, g, b = (rgb[..., i] for i in range(3))
    return (r * 4899 + g * 9617 + b * 1868 + 8192) >> 14


def png_grey(rgb: np.ndarray) -> np.ndarray:
    """libpng's png_do_rgb_to_gray (no gamma): 15-bit weights, truncated, blue the rest."""
    r, g, b = (rgb[..., i] for i in range(3))
    return (r * 9797 + g * 19234 + b * (32768 - 9797 - 19234)) >> 15


@pytest.mark.parametrize(
    "name",
    ["png_rgb.png", "png_rgba.png", "bmp_rgb.bmp", "bmp_rgba.bmp", "ppm_rgb.ppm",
     "tiff_rgb.tif", "tiff_lzw.tif", "webp_lossless.webp", "png_palette.png",
     "bmp_palette.bmp", "png_palette_trns.png", "jpeg_444.jpg"],
)  # fmt: skip
def test_colour_is_bgr_alpha_dropped_palette_expanded(name: str) -> None:
    expected = pillow(name, "RGB")[:, :, ::-1]
    assert read_image(path(name), color=True).tolist() == expected.tolist()


@pytest.mark.parametrize("name", ["png_grey.png", "bmp_grey.bmp", "pgm_grey.pgm", "jpeg_grey.jpg",
                                  "png_grey_alpha.png", "tiff_grey.tiff"])  # fmt: skip
def test_grey_in_colour_is_repeated(name: str) -> None:
    grey = pillow(name, "L")
    image = read_image(path(name), color=True)
    assert image.shape == grey.shape + (3,)
    assert all(image[:, :, c].tolist() == grey.tolist() for c in range(3))
    assert read_image(path(name), color=False).tolist() == grey.tolist()


@pytest.mark.parametrize("name", ["png_rgb.png", "png_rgba.png", "png_palette.png"])
def test_png_grey_is_libpngs_truncated_sum(name: str) -> None:
    assert read_image(path(name), color=False).tolist() == png_grey(pillow(name, "RGB")).tolist()


@pytest.mark.parametrize("name", ["bmp_rgb.bmp", "bmp_palette.bmp", "ppm_rgb.ppm", "tiff_rgb.tif"])
def test_bmp_ppm_tiff_grey_is_opencvs_rounded_sum(name: str) -> None:
    assert (
        read_image(path(name), color=False).tolist() == rounded_grey(pillow(name, "RGB")).tolist()
    )


def test_webp_grey_is_cvtcolors_15_bit_sum() -> None:
    rgb = pillow("webp_lossless.webp", "RGB")
    r, g, b = (rgb[..., i] for i in range(3))
    expected = (r * 9798 + g * 19235 + b * 3735 + 16384) >> 15
    assert read_image(path("webp_lossless.webp"), color=False).tolist() == expected.tolist()


@pytest.mark.parametrize(
    "name", ["jpeg_420.jpg", "jpeg_422.jpg", "jpeg_444.jpg", "jpeg_progressive.jpeg"]
)
def test_jpeg_grey_is_libjpegs_luma(name: str) -> None:
    with Image.open(path(name)) as im:
        im.draft("YCbCr", im.size)
        luma = np.asarray(im)[:, :, 0]
    assert read_image(path(name), color=False).tolist() == luma.tolist()


def test_sixteen_bits_keep_the_high_byte(tmp_path) -> None:
    samples = np.arange(6 * 5, dtype=np.uint16).reshape(5, 6) * 2111
    raw = b"".join(b"\0" + row.astype(">u2").tobytes() for row in samples)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 6, 5, 16, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))  # fmt: skip
    assert decode_image(png, color=False, where="x").tolist() == (samples >> 8).tolist()


def test_sixteen_bit_colour_grey_uses_the_low_bytes_too() -> None:
    """libpng converts to grey on 16-bit samples, then keeps the high byte."""
    with open(path("png_rgb16.png"), "rb") as stream:
        data = stream.read()
    wide = read_16bit_rgb(data)
    expected = png_grey(wide.astype(np.int64)) >> 8
    assert decode_image(data, color=False, where="x").tolist() == expected.tolist()
    assert decode_image(data, color=True, where="x").tolist() == (wide[:, :, ::-1] >> 8).tolist()


def read_16bit_rgb(data: bytes) -> np.ndarray:
    """The corpus's 16-bit PNGs are written with filter 0: the samples, straight."""
    width, height = struct.unpack(">II", data[16:24])
    idat = b"".join(
        data[i + 8 : i + 8 + struct.unpack(">I", data[i : i + 4])[0]]
        for i in chunk_offsets(data) if data[i + 4 : i + 8] == b"IDAT"
    )  # fmt: skip
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, -1)[:, 1:]
    return rows.copy().view(">u2").reshape(height, width, 3).astype(np.uint16)


def chunk_offsets(data: bytes) -> list[int]:
    offsets, i = [], 8
    while i < len(data):
        offsets.append(i)
        i += 12 + struct.unpack(">I", data[i : i + 4])[0]
    return offsets


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    with Image.open(path(f"jpeg_exif{orientation}.jpg")) as im:
        upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))[:, :, ::-1]
    image = read_image(path(f"jpeg_exif{orientation}.jpg"), color=True)
    assert image.tolist() == upright.tolist()


def test_png_exif_orientation_is_applied() -> None:
    assert read_image(path("png_exif6.png"), color=True).shape == (31, 23, 3)


def test_cmyk_jpeg_as_opencv_converts_it() -> None:
    with Image.open(path("jpeg_cmyk.jpg")) as im:
        stored = 255 - np.asarray(im).astype(np.int64)  # Pillow inverts Adobe's CMYK
    k = stored[:, :, 3]
    c, m, y = (k - (((255 - stored[:, :, i]) * k) >> 8) for i in range(3))
    assert read_image(path("jpeg_cmyk.jpg"), color=True).tolist() == np.stack([y, m, c], 2).tolist()


def test_tiff_alpha_is_multiplied_in() -> None:
    rgba = pillow("tiff_rgba.tif", "RGBA")
    expected = (rgba[:, :, :3] * rgba[:, :, 3:] + 127) // 255
    assert read_image(path("tiff_rgba.tif"), color=True).tolist() == expected[:, :, ::-1].tolist()


def test_pgm_samples_below_255_are_kept_as_stored() -> None:
    with open(path("pgm_maxval100.pgm"), "rb") as stream:
        stored = np.frombuffer(stream.read()[-31 * 23 :], dtype=np.uint8).reshape(23, 31)
    assert read_image(path("pgm_maxval100.pgm"), color=False).tolist() == stored.tolist()


def test_to_chw() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert to_chw(image)[1].tolist() == image[:, :, 1].tolist()
    assert to_chw(image[:, :, 0]).shape == (1, 2, 3)
    flipped = image[:, ::-1, 0]  # not contiguous: the record joins to_chw's buffer as it is
    assert to_chw(flipped).flags.c_contiguous
    assert bytes(to_chw(flipped)) == flipped.tobytes()


def test_png_is_written_as_opencv_writes_it() -> None:
    image = read_image(path("png_rgb.png"), color=True)
    png = encode_image(image, "png")
    offsets = chunk_offsets(png)
    kinds = [png[i + 4 : i + 8] for i in offsets]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and set(kinds[1:-1]) == {b"IDAT"}
    idat = b"".join(
        png[i + 8 : i + 8 + struct.unpack(">I", png[i : i + 4])[0]] for i in offsets[1:-1]
    )
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(23, -1)
    assert set(rows[:, 0].tolist()) == {1}  # Sub on every row
    assert np.asarray(Image.open(io.BytesIO(png)))[:, :, ::-1].tolist() == image.tolist()


def test_jpeg_is_written_at_quality_95_420() -> None:
    image = read_image(path("png_rgb.png"), color=True)
    with Image.open(io.BytesIO(encode_image(image, "jpg"))) as im:
        assert im.format == "JPEG" and im.layer[0][1:3] == (2, 2)  # 4:2:0


def test_formats_by_signature() -> None:
    names = ("png_rgb.png", "jpeg_420.jpg", "bmp_rgb.bmp", "tiff_rgb.tif", "webp_lossy.webp",
             "pgm_grey.pgm")  # fmt: skip
    found = []
    for name in names:
        with open(path(name), "rb") as stream:
            found.append(image_format(stream.read()))
    assert found == ["PNG", "JPEG", "BMP", "TIFF", "WEBP", "PPM"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a....", "x.gif: not an image OpenCV reads (PNG, JPEG, BMP, PPM, TIFF, WebP)"),
        (b"\x89PNG\r\n\x1a\nnot really", "x.gif: PNG image cannot be decoded"),
    ],
)
def test_unreadable_is_named(data: bytes, message: str) -> None:
    with pytest.raises(ImageError) as caught:
        decode_image(data, color=True, where="x.gif")
    assert str(caught.value).startswith(message)


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(ImageError) as caught:
        encode_image(np.zeros((2, 2), dtype=np.uint8), "tif")
    assert str(caught.value) == (
        "cannot encode images as 'tif': the types written as Caffe writes them are "
        "png, jpg, jpeg, jpe, bmp, dib"
    )
