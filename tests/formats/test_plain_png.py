"""The plain-PNG path (mnist2db.formats.plain_png) against Pillow's own PNG reader: the same
record for every plain PNG (every filter, chunk layout and size; grey and RGB; read in colour
and grey), and None, so that the full path decides, for everything else."""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from png_helpers import chunk, png_of

from mnist2db.errors import ImageError
from mnist2db.formats.datum.message import datum_prefix
from mnist2db.formats.imread.reader import decode_image, png_planes
from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.formats.plain_png import plain_record, plain_samples, png_data_complete
from mnist2db.formats.protowire import encode_varint
from mnist2db.imageset.decoding import image_record
from mnist2db.imageset.work import RecordWork


def expected_record(data: bytes, color: bool, label: int) -> bytes:
    """Caffe's raw Datum of a PNG decoded by Pillow's PngImagePlugin: grey in every channel
    in colour, RGB as B, G, R planes."""
    with Image.open(io.BytesIO(data)) as opened:
        pixels = np.asarray(opened)
    if pixels.ndim == 2:
        planes = np.stack([pixels] * 3) if color else pixels[None]
    else:
        planes = pixels[:, :, ::-1].transpose(2, 0, 1)
    channels, height, width = planes.shape
    body = np.ascontiguousarray(planes).tobytes()
    return (
        datum_prefix(channels, height, width, len(body))
        + body
        + b"\x28"
        + encode_varint(label)
        + b"\x38\x00"
    )


def pillow_png(image: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, "PNG", **options)
    return out.getvalue()


def write(tmp_path: Path, data: bytes, name: str = "a.png") -> bytes:
    target = tmp_path / name
    target.write_bytes(data)
    return os.fsencode(target)


images = st.tuples(
    st.integers(1, 40), st.integers(1, 40), st.booleans(), st.integers(0, 2**32 - 1)
).map(
    lambda t: np.random.default_rng(t[3]).integers(
        0, 256, (t[0], t[1]) if t[2] else (t[0], t[1], 3), dtype=np.uint8
    )
)


@settings(max_examples=150, deadline=None)
@given(image=images, color=st.booleans(), label=st.integers(-(2**31), 2**31 - 1),
       compress=st.integers(0, 9), extra=st.booleans())  # fmt: skip
def test_a_plain_png_is_its_samples_in_caffes_layout(
    tmp_path_factory: pytest.TempPathFactory, image: np.ndarray, color: bool, label: int,
    compress: int, extra: bool,
) -> None:  # fmt: skip
    # Pillow's writer filters rows adaptively (None, Sub, Up, Average, Paeth); an inert
    # text chunk and IDATs split in two take the chunk walk instead of the usual layout.
    data = pillow_png(image, compress_level=compress)
    if extra:
        end = 33 + 12 + struct.unpack(">I", data[33:37])[0]
        body = data[41 : end - 4]
        half = len(body) // 2
        data = (data[:33] + chunk(b"tEXt", b"Comment\x00hi") + chunk(b"IDAT", body[:half])
                + chunk(b"IDAT", body[half:]) + data[end:])  # fmt: skip
    path = write(tmp_path_factory.mktemp("png"), data)
    made = plain_record(path, color, label)
    if image.ndim == 3 and not color:
        assert made is None  # libpng's grey weights: the full path's
        return
    assert made is not None
    assert made[0] == expected_record(data, color, label)
    assert made[1] == ((3 if color else 1), image.shape[0], image.shape[1])


def test_a_kept_buffer_never_shows_in_an_earlier_record(tmp_path: Path) -> None:
    first, second = (np.full((5, 7), value, np.uint8) for value in (10, 200))
    a = plain_record(write(tmp_path, pillow_png(first), "a.png"), False, 0)
    b = plain_record(write(tmp_path, pillow_png(second), "b.png"), False, 0)
    assert a is not None and b is not None
    assert a[0].count(10) >= 35 and b[0].count(200) >= 35 and 200 not in a[0][-37:]
    samples = plain_samples(pillow_png(first))
    plain_record(write(tmp_path, pillow_png(second), "c.png"), False, 0)
    assert samples is not None and samples[3] == first.tobytes()


def _adam7(image: np.ndarray) -> bytes:
    """A grey image's rows in Adam7's seven passes, each row unfiltered."""
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                           (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):  # fmt: skip
        part = image[y0::dy, x0::dx]
        if part.size:
            raw += b"".join(b"\x00" + row.tobytes() for row in part)
    return raw


def _with_data(image: np.ndarray, raw: bytes, depth: int = 8, colour: int = 0,
               interlace: int = 0, extra: bytes = b"") -> bytes:  # fmt: skip
    height, width = image.shape[:2]
    return (b"\x89PNG\r\n\x1a\n" + header(width, height, depth, colour, interlace) + extra
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))  # fmt: skip


def short_pngs() -> dict[str, tuple[bytes, bytes]]:
    """PNGs whose image data is whole, and the same with the data ending before the last
    row's end, of every kind (each of the two paths, 16-bit, palette, Adam7)."""
    rng = np.random.default_rng(26)
    grey = rng.integers(0, 256, (6, 5), dtype=np.uint8)
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    rows = b"".join(b"\x00" + row.tobytes() for row in grey)
    rgb_rows = b"".join(b"\x00" + row.tobytes() for row in rgb.reshape(6, 15))
    wide = b"".join(
        b"\x00" + row.tobytes() for row in rng.integers(0, 256, (6, 10), dtype=np.uint8)
    )
    palette = chunk(b"PLTE", bytes(range(256)) * 3)
    kinds = {
        "grey": (grey, rows, {}),
        "rgb": (rgb, rgb_rows, {"colour": 2}),
        "16-bit": (grey, wide, {"depth": 16}),
        "palette": (grey, rows, {"colour": 3, "extra": palette}),
        "adam7": (grey, _adam7(grey), {"interlace": 1}),
    }
    return {
        name: (_with_data(image, raw, **options), _with_data(image, raw[:-1], **options))
        for name, (image, raw, options) in kinds.items()
    }


@pytest.mark.parametrize("name", ["grey", "rgb", "16-bit", "palette", "adam7"])
def test_image_data_that_ends_before_the_last_row_is_refused(tmp_path: Path, name: str) -> None:
    """libpng refuses such a PNG ("Not enough image data": Caffe skips the image, checked
    with Caffe's convert_imageset on these kinds), where Pillow writes the missing rows as 0:
    neither path makes a record of it, and the full path names why."""
    whole, short = short_pngs()[name]
    for color in (True, False):
        decode_image(whole, color=color, where="whole.png")  # the whole one decodes
        assert plain_record(write(tmp_path, short, "short.png"), color, 0) is None
        with pytest.raises(ImageError) as caught:
            decode_image(short, color=color, where="short.png")
        assert str(caught.value) == "short.png: PNG image data ends before its last row (truncated)"


@pytest.mark.parametrize("value", [0x5A, 0])
def test_a_last_row_like_the_sentinel_is_still_an_image(tmp_path: Path, value: int) -> None:
    """A last row that holds what the decoder's buffer held before (the sentinel) is told
    from one never decoded by inflating the stream again: the image is read as it is."""
    grey = np.full((3, 4), value, np.uint8)
    rgb = np.tile(np.array([0x5A, 0xA5, 0x3C], np.uint8), (3, 4, 1))
    for image in (grey, rgb):
        data = png_of(image, colour=2 if image.ndim == 3 else 0)
        made = plain_record(write(tmp_path, data, "same.png"), True, 0)
        assert made is not None and made[0] == expected_record(data, True, 0)
    assert png_data_complete(png_of(grey))


def test_a_kept_buffer_after_a_short_stream_is_whole_again(tmp_path: Path) -> None:
    """A short stream is refused, and the next image of the size, decoded into the same
    kept buffer, is its own pixels."""
    full = np.full((3, 4), 9, np.uint8)
    short = png_of(full, raw=b"\x00\x01\x02\x03\x04")  # one row of three
    assert plain_record(write(tmp_path, short, "short.png"), False, 0) is None
    made = plain_record(write(tmp_path, png_of(full), "full.png"), False, 0)
    assert made is not None and made[0][-16:-4] == bytes([9]) * 12


def test_threads_each_decode_their_own(tmp_path: Path) -> None:
    files = [write(tmp_path, pillow_png(np.full((28, 28), v, np.uint8)), f"{v}.png")
             for v in range(1, 9)]  # fmt: skip
    wrong: list[int] = []

    def decode(value: int) -> None:
        for _ in range(300):
            made = plain_record(files[value - 1], False, 0)
            if made is None or made[0][-(28 * 28 + 4) : -4] != bytes([value]) * 784:
                wrong.append(value)

    threads = [threading.Thread(target=decode, args=(v,)) for v in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def header(width: int, height: int, depth: int, colour: int, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace))


def palette_png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).convert("P").save(out, "PNG")
    return out.getvalue()


def not_plain() -> dict[str, bytes]:
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    good = png_of(grey)
    idat = good[33:-12]
    return {
        "16-bit": pillow_png(grey.astype(np.uint16) * 257),
        "palette": palette_png(grey),
        "grey+alpha": pillow_png(np.stack([grey, grey], axis=2)),
        "rgba": pillow_png(np.stack([grey] * 4, axis=2)),
        "interlaced": good[:8] + header(4, 3, 8, 0, 1) + idat + good[-12:],
        "gamma": good[:33] + chunk(b"gAMA", struct.pack(">I", 45455)) + good[33:],
        "profile": good[:33] + chunk(b"iCCP", b"x\x00\x00" + zlib.compress(b"p")) + good[33:],
        "bad IDAT CRC": good[:-16] + bytes([good[-16] ^ 1]) + good[-15:],
        "bad IHDR CRC": good[:29] + bytes([good[29] ^ 1]) + good[30:],
        "cut short": good[:40],
        "not a PNG": b"GIF89a" + good[6:],
        "over 2^20 wide": good[:8] + header(1 << 21, 1, 8, 0) + idat + good[-12:],
    }


@pytest.mark.parametrize("name", sorted(not_plain()))
def test_anything_else_is_left_to_the_full_path(tmp_path: Path, name: str) -> None:
    data = not_plain()[name]
    path = write(tmp_path, data)
    assert plain_record(path, True, 0) is None
    assert plain_record(path, False, 0) is None


def test_what_is_not_a_readable_file_is_left_to_the_full_path(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    (tmp_path / "dir.png").mkdir()
    for name in ("fifo.png", "dir.png", "missing.png"):
        assert plain_record(os.fsencode(tmp_path / name), True, 0) is None


def test_the_full_path_gives_the_same_record(tmp_path: Path) -> None:
    """``image_record`` (its own plain-PNG branch: png_planes) and ``decode_image`` agree
    with the path from a file, for grey and RGB, in colour and grey."""
    for k, image in enumerate([np.arange(35, dtype=np.uint8).reshape(5, 7),
                               np.arange(105, dtype=np.uint8).reshape(5, 7, 3)]):  # fmt: skip
        data = pillow_png(image)
        root = os.fsencode(tmp_path) + b"/"
        write(tmp_path, data, f"{k}.png")
        for color in (True, False):
            if image.ndim == 3 and not color:
                assert png_planes(data, color) is None
                continue
            entry = ListEntry(0, f"{k}.png".encode(), 3)
            made = plain_record(root + entry.path, color, 3)
            assert made is not None
            assert image_record(entry, root=root, color=color, resize=None, encoding=None) == made
            assert RecordWork(root, color, None, False, None)(entry) == made
            decoded = decode_image(data, color=color, where="x")
            assert decoded.shape[:2] == image.shape[:2]
