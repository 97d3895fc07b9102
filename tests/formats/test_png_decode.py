"""The PNG decoder (mnist2db.formats.imdecode.png_decoder): Pillow's pixels on every PNG, OpenCV's layout, and one
DatumError naming the record for anything hostile."""

from __future__ import annotations

import io
import struct
import threading
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from os_helpers import in_forked_child
from PIL import Image

from mnist2db.errors import DatumError
from mnist2db.formats.imdecode.png_decoder import decode_datum_image, decode_png
from mnist2db.formats.png.encoder import encode_png
from mnist2db.reading.threaded import decode_many

WHERE = "db: key 00000007"
CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
PILLOW_MODES = {0: "L", 2: "RGB", 4: "LA", 6: "RGBA"}


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def ihdr(width: int, height: int, depth: int = 8, colour: int = 0, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filter_rows(pixels: np.ndarray, filters: list[int]) -> bytes:
    """The PNG specification's filters, byte by byte: the reference the decoder must undo."""
    height, width, bpp = pixels.shape
    rows = pixels.reshape(height, width * bpp).astype(int)
    out = bytearray()
    for r, kind in enumerate(filters):
        out.append(kind)
        for x in range(width * bpp):
            a = rows[r, x - bpp] if x >= bpp else 0
            b = rows[r - 1, x] if r else 0
            c = rows[r - 1, x - bpp] if r and x >= bpp else 0
            predictor = (0, a, b, (a + b) // 2, paeth(a, b, c))[kind]
            out.append((rows[r, x] - predictor) % 256)
    return bytes(out)


def make_png(
    pixels: np.ndarray,
    colour: int,
    filters: list[int],
    splits: list[int] = (),  # type: ignore[assignment]
    level: int = 6,
    extra: list[bytes] = (),  # type: ignore[assignment]
) -> bytes:
    height, width, _ = pixels.shape
    data = zlib.compress(filter_rows(pixels, filters), level)
    cuts = sorted({min(max(0, s), len(data)) for s in splits} | {0, len(data)})
    idats = b"".join(chunk(b"IDAT", data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False))
    body = b"".join(extra)
    return (
        b"\x89PNG\r\n\x1a\n" + ihdr(width, height, 8, colour) + body + idats + chunk(b"IEND", b"")
    )


def caffe_layout(pixels: np.ndarray, colour: int) -> np.ndarray:
    """OpenCV's IMREAD_UNCHANGED layout, (c, h, w): grey 1, BGR 3, BGRA 4 (grey+alpha: GGGA)."""
    order = {0: [0], 2: [2, 1, 0], 4: [0, 0, 0, 1], 6: [2, 1, 0, 3]}[colour]
    return np.ascontiguousarray(pixels[:, :, order].transpose(2, 0, 1))


def pillow_layout(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        mode = image.mode
        if mode == "LA":
            image = image.convert("RGBA")
        elif mode == "P" or (mode == "RGB" and "transparency" in image.info):
            # OpenCV expands a palette, and a colour image's tRNS colour key, to BGR(A)
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        elif mode == "1":
            image = image.convert("L")
        array = np.asarray(image)
    if array.ndim == 2:
        return array[np.newaxis]
    order = [2, 1, 0] if array.shape[2] == 3 else [2, 1, 0, 3]
    return np.ascontiguousarray(array[:, :, order].transpose(2, 0, 1))


@st.composite
def random_pngs(draw: st.DrawFn) -> tuple[bytes, np.ndarray, int]:
    colour = draw(st.sampled_from([0, 2, 4, 6]))
    height = draw(st.integers(1, 12))
    width = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    style = draw(st.sampled_from(["noise", "flat", "gradient"]))
    shape = (height, width, CHANNELS[colour])
    if style == "noise":
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    elif style == "flat":
        pixels = np.full(shape, draw(st.integers(0, 255)), np.uint8)
    else:
        pixels = (np.add.outer(np.arange(height), np.arange(width))[:, :, None] * 7 + seed) % 256
        pixels = np.broadcast_to(pixels, shape).astype(np.uint8)
    filters = draw(st.lists(st.integers(0, 4), min_size=height, max_size=height))
    splits = draw(st.lists(st.integers(0, 400), max_size=4))
    level = draw(st.integers(0, 9))
    return make_png(pixels, colour, filters, splits, level), pixels, colour


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_pngs())
def test_every_filter_and_idat_split_decodes_to_the_pixels_as_pillow(
    case: tuple[bytes, np.ndarray, int],
) -> None:
    png, pixels, colour = case
    decoded = decode_png(png, WHERE)
    expected = caffe_layout(pixels, colour)
    assert decoded.dtype == np.uint8 and decoded.flags.writeable and decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(decoded, pillow_layout(png))


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["L", "RGB", "LA", "RGBA", "P", "1", "PT", "RGBT", "LT"]),
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(0, 2**32 - 1),
    st.sampled_from([{}, {"optimize": True}, {"compress_level": 0}, {"compress_level": 1}]),
    st.booleans(),
)
def test_pngs_written_by_pillow_decode_as_pillow_reads_them(
    mode: str, height: int, width: int, seed: int, options: dict[str, object], gradient: bool
) -> None:
    rng = np.random.default_rng(seed)
    base = mode.rstrip("T") if mode != "PT" else "P"
    bands = {"L": 1, "RGB": 3, "LA": 2, "RGBA": 4, "P": 3, "1": 1}[base]
    if gradient:
        ramp = np.add.outer(np.arange(height), np.arange(width)) * 3 % 256
        pixels = np.repeat(ramp[:, :, None], bands, axis=2).astype(np.uint8)
    else:
        pixels = rng.integers(0, 256, (height, width, bands), dtype=np.uint8)
    if base == "P":
        image = Image.fromarray(pixels, "RGB").quantize(colors=int(rng.integers(2, 256)))
    elif base == "1":
        image = Image.fromarray(pixels[:, :, 0] > 127)
    else:
        image = Image.fromarray(pixels if bands > 1 else pixels[:, :, 0], base)
    saved = dict(options)
    if mode.endswith("T"):
        saved["transparency"] = 1 if base == "P" else (1,) * 3 if base == "RGB" else 1
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **saved)
    png = buffer.getvalue()
    np.testing.assert_array_equal(decode_png(png, WHERE), pillow_layout(png))


def test_interlaced_and_low_bit_depth_pngs_go_through_pillow() -> None:
    image = Image.fromarray(np.arange(60, dtype=np.uint8).reshape(6, 10) * 4)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", interlace=True)  # Pillow writes no Adam7: hand-made below
    # A 2-bit grey image, written by hand: 4 pixels a byte, scaled by 85 when read.
    values = np.array([[0, 1, 2, 3, 3, 2]], np.uint8)
    packed = bytes([0, 0b00011011, 0b11100000])
    png = b"\x89PNG\r\n\x1a\n" + ihdr(6, 1, 2, 0) + chunk(b"IDAT", zlib.compress(packed))
    png += chunk(b"IEND", b"")
    np.testing.assert_array_equal(decode_png(png, WHERE)[0], values * 85)
    # Adam7 by hand: a 1x1 image has one pass with one row.
    png = b"\x89PNG\r\n\x1a\n" + ihdr(1, 1, 8, 0, 1) + chunk(b"IDAT", zlib.compress(b"\0\x2a"))
    png += chunk(b"IEND", b"")
    assert decode_png(png, WHERE).tolist() == [[[42]]]


def test_mnist2db_pngs_decode_to_their_pixels() -> None:
    rng = np.random.default_rng(3)
    for rows, cols in ((1, 1), (28, 28), (3, 200)):
        image = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        decoded = decode_png(encode_png(image), WHERE)
        assert decoded.shape == (1, rows, cols)
        np.testing.assert_array_equal(decoded[0], image)
        decoded[0, 0, 0] ^= 1  # writable, and not shared with anything
        np.testing.assert_array_equal(decode_png(encode_png(image), WHERE)[0], image)


def test_a_jpeg_still_decodes_through_pillow() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), (10, 200, 30), np.uint8)).save(buffer, format="JPEG")
    decoded = decode_datum_image(buffer.getvalue(), WHERE)
    assert decoded.shape == (3, 8, 8)
    assert abs(int(decoded[0, 4, 4]) - 30) < 8 and abs(int(decoded[2, 4, 4]) - 10) < 8  # BGR


# -- hostile PNGs -------------------------------------------------------------------------

GOOD = encode_png(np.arange(35, dtype=np.uint8).reshape(5, 7))


def refused(data: bytes) -> str:
    with pytest.raises(DatumError) as caught:
        decode_datum_image(data, WHERE)
    text = str(caught.value)
    assert text.startswith(WHERE + ": ") and "\n" not in text
    return text


def test_a_66_byte_png_claiming_20000_by_20000_pixels_is_refused_before_allocating() -> None:
    png = b"\x89PNG\r\n\x1a\n" + ihdr(20000, 20000) + chunk(b"IDAT", zlib.compress(b"\0" * 100))
    png += chunk(b"IEND", b"")
    assert len(png) < 80
    text = refused(png)
    assert "claims 20000x20000 pixels" in text and "cannot hold that many" in text
    # Above OpenCV's 2^30 pixels: refused from the header alone.
    assert "more than the 1073741824 pixels" in refused(GOOD[:8] + ihdr(40000, 40000) + GOOD[33:])


def test_a_stream_that_inflates_to_far_more_stops_at_the_declared_size() -> None:
    # 50 MB of zeros in ~50 kB: the header says 1x1, so 2 bytes are all that is needed.
    bomb = zlib.compress(b"\0" * (50 << 20), 9)
    png = b"\x89PNG\r\n\x1a\n" + ihdr(1, 1) + chunk(b"IDAT", bomb) + chunk(b"IEND", b"")
    assert decode_png(png, WHERE).tolist() == [[[0]]]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "cannot be decoded: not a PNG, nor an image Pillow identifies (0 bytes"),
        (b"GIF89a" + bytes(20), "encoded"),
        (GOOD[:8] + ihdr(0, 5) + GOOD[33:], "is 0x5: a side of 0 pixels"),
        (GOOD[:8] + ihdr(4, 0) + GOOD[33:], "is 4x0: a side of 0 pixels"),
        (GOOD[:8] + ihdr(7, 5, 16) + GOOD[33:], "16-bit PNG: Caffe's data layer takes 8-bit"),
        (GOOD[:8] + ihdr(7, 5, 8, 1) + GOOD[33:], "colour type 1 does not exist"),
        (GOOD[:8] + ihdr(7, 5, 4, 2) + GOOD[33:], "bit depth 4 is not allowed for colour"),
        (GOOD[:8] + ihdr(7, 5, 8, 3) + GOOD[33:], "palette PNG without a PLTE chunk"),
        (GOOD[:8] + GOOD[8:29] + b"\0\0\0\0" + GOOD[33:], "IHDR chunk fails its CRC check"),
        (GOOD[:-16] + b"\0\0\0\0" + GOOD[-12:], "chunk IDAT at byte 33 fails its CRC check"),
        (GOOD[:-4] + b"\0\0\0\0", "chunk IEND at byte"),
        (GOOD[:33] + b"\x7f\0\0\0" + GOOD[37:], "claims 2130706432 bytes"),
        (GOOD[:33] + b"\0\0\0\x05" + GOOD[37:], "fails its CRC check"),
        (GOOD[:-12], "truncated at byte"),
        (GOOD[:33] + chunk(b"IEND", b""), "no IDAT chunk"),
        (GOOD[:8] + chunk(b"IEND", b""), "does not begin with a 13-byte IHDR"),
    ],
)
def test_a_broken_png_is_one_line_naming_the_record(data: bytes, message: str) -> None:
    assert message in refused(data)


def test_damaged_image_data_is_refused() -> None:
    body = zlib.compress(b"\0" * 8 * 5)  # 5 rows of 7 pixels and a filter byte each
    head = GOOD[:33]
    end = chunk(b"IEND", b"")
    assert "does not inflate" in refused(head + chunk(b"IDAT", b"\x78\x9c\xff\xff") + end)
    short = zlib.compress(b"\0" * 8 * 4)
    assert "holds 32 bytes, its header needs 40 (truncated)" in refused(
        head + chunk(b"IDAT", short) + end
    )
    bad_filter = bytearray(b"\0" * 40)
    bad_filter[16] = 9
    assert "row 2: filter type 9 does not exist" in refused(
        head + chunk(b"IDAT", zlib.compress(bytes(bad_filter))) + end
    )
    apart = head + chunk(b"IDAT", body[:5]) + chunk(b"tEXt", b"a\0b") + chunk(b"IDAT", body[5:])
    assert "IDAT chunks are not consecutive" in refused(apart + end)


def test_every_truncation_and_every_single_byte_change_is_decoded_or_refused() -> None:
    png = make_png(np.arange(48, dtype=np.uint8).reshape(4, 4, 3), 2, [0, 1, 2, 4], [7])
    expected = decode_png(png, WHERE)
    for cut in range(len(png)):
        refused(png[:cut])
    for position in range(len(png)):
        for value in (0, 1, 0x7F, 0xFF, png[position] ^ 0x10):
            mutated = bytearray(png)
            mutated[position] = value
            try:
                decoded = decode_datum_image(bytes(mutated), WHERE)
            except DatumError as exc:
                assert str(exc).startswith(WHERE + ": ")
            else:  # only a change the CRC does not cover (a CRC's own lucky bytes) decodes
                assert decoded.shape == expected.shape or bytes(mutated) == png


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 200))
def test_random_bytes_after_a_png_header_never_escape_as_another_error(
    tail: bytes, cut: int
) -> None:
    data = (GOOD[:cut] + tail) if cut < len(GOOD) else GOOD + tail
    try:
        decode_datum_image(data, WHERE)
    except DatumError as exc:
        assert str(exc).startswith(WHERE + ": ")


# -- batches ------------------------------------------------------------------------------


def test_decode_many_keeps_the_order_and_raises_the_first_failure_in_order() -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (700, 6, 5), dtype=np.uint8)
    pngs = [encode_png(image) for image in images]
    wheres = [f"key {i}" for i in range(len(pngs))]
    decoded = decode_many(decode_datum_image, pngs, wheres)
    np.testing.assert_array_equal(np.stack(decoded)[:, 0], images)
    pngs[300] = pngs[500] = b"broken"
    with pytest.raises(DatumError, match=r"^key 300: "):
        decode_many(decode_datum_image, pngs, wheres)


def test_decode_many_in_a_forked_child_uses_its_own_threads() -> None:
    pngs = [encode_png(np.full((3, 3), i % 256, np.uint8)) for i in range(300)]
    wheres = ["x"] * len(pngs)
    assert len(decode_many(decode_datum_image, pngs, wheres)) == 300  # the parent's pool exists

    def child() -> str:  # on a thread of the child: a pool of the parent's would hang it
        result: list[int] = []
        thread = threading.Thread(
            target=lambda: result.append(len(decode_many(decode_datum_image, pngs, wheres))),
            daemon=True,
        )
        thread.start()
        thread.join(20)
        return str(result)

    assert in_forked_child(child) == str([300])


# -- mnist2db's own records, read without protobuf -----------------------------------------


def general_path(value: bytes) -> tuple[np.ndarray, int] | str:
    from mnist2db.formats.datum.message import decode_datum

    try:
        datum = decode_datum(value)
        return decode_datum_image(datum.data, WHERE), int(datum.label)
    except DatumError as exc:
        return str(exc)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 70),
    st.integers(1, 70),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_a_record_read_without_protobuf_is_what_protobuf_and_the_decoder_give(
    rows: int, cols: int, label: int, seed: int, changes: list[tuple[int, int]]
) -> None:
    from mnist2db.formats.png.encoder import encode_png_batch
    from mnist2db.reading.png_datums import decode_png_record

    image = np.random.default_rng(seed).integers(0, 256, (1, rows, cols), dtype=np.uint8)
    value = bytearray(encode_png_batch(image, np.array([label])).pop())
    if not changes:
        found = decode_png_record(bytes(value))
        assert (found is not None) == (0 <= label < 128)
    for position, byte in changes:
        value[position % len(value)] = byte
    found = decode_png_record(bytes(value))
    expected = general_path(bytes(value))
    if found is not None:
        assert not isinstance(expected, str), expected
        np.testing.assert_array_equal(found[0], expected[0])
        assert found[1] == expected[1]
    elif not changes and 0 <= label < 128:
        pytest.fail("a record as mnist2db writes it was not read")


def test_record_heads_other_than_the_three_shape_fields_take_the_general_path() -> None:
    from mnist2db.reading.png_datums import decode_png_record

    png = encode_png(np.zeros((2, 2), np.uint8))
    tail = bytes([len(png)]) + png + b"\x28\x05\x38\x01"
    assert decode_png_record(b"\x08\x01\x10\x02\x18\x02\x22" + tail) is not None
    for head in (
        b"\x08\x01\x10\x02\x22",
        b"\x08\x01\x10\x02\x18\x82\x22",
        b"\x50\x01\x10\x02\x18\x02\x22",
    ):
        assert decode_png_record(head + tail) is None
    assert decode_png_record(b"\x38\x01") is None
