"""mnist2db's own deflate (formats/png/deflate.py): fixed Huffman codes, run-length matches.

The tiny cases are derived here from RFC 1951's tables, bit by bit; everything else is
checked against zlib's inflater and Pillow's PNG decoder.
"""

from __future__ import annotations

import gzip
import io
import zlib

import numpy as np
import pytest
from helpers import fashion_file
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mnist2db.formats.png import deflate
from mnist2db.formats.png.deflate import max_stream_size, zlib_stream, zlib_streams
from mnist2db.formats.png.encoder import encode_png

# -- RFC 1951, by hand ----------------------------------------------------------------------


def huffman(code: int, bits: int) -> str:
    """A Huffman code as it goes into the stream: most significant bit first (3.1.1)."""
    return format(code, f"0{bits}b")


def number(value: int, bits: int) -> str:
    """Any other field (header, extra bits): least significant bit first (3.1.1)."""
    return format(value, f"0{bits}b")[::-1] if bits else ""


def literal(byte: int) -> str:
    """3.2.6: 0-143 are 8-bit codes from 00110000, 144-255 9-bit ones from 110010000."""
    return huffman(0x30 + byte, 8) if byte < 144 else huffman(0x190 + byte - 144, 9)


def length(symbol: int) -> str:
    """3.2.6: 256-279 are 7-bit codes from 0000000, 280-287 8-bit ones from 11000000."""
    return huffman(symbol - 256, 7) if symbol < 280 else huffman(0xC0 + symbol - 280, 8)


HEADER = "1" + number(1, 2)  # BFINAL 1, BTYPE 01 (fixed Huffman codes)
END = length(256)
DISTANCE_1 = huffman(0, 5)  # distance code 0 (distance 1): five bits, no extra bits


def packed(bits: str) -> bytes:
    """The stream's bits into bytes, each byte filled from its least significant bit."""
    bits += "0" * (-len(bits) % 8)
    return bytes(int(bits[i : i + 8][::-1], 2) for i in range(0, len(bits), 8))


def adler32(data: bytes) -> bytes:
    """RFC 1950 8.2."""
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % 65521
        b = (b + a) % 65521
    return (b << 16 | a).to_bytes(4, "big")


def zlib_of(bits: str, data: bytes) -> bytes:
    return b"\x78\x01" + packed(bits) + adler32(data)


def test_a_1x1_image_is_two_literals() -> None:
    data = bytes([0, 200])  # filter byte 0, then the pixel
    bits = HEADER + literal(0) + literal(200) + END
    assert len(bits) == 3 + 8 + 9 + 7
    assert zlib_stream(data) == zlib_of(bits, data)
    # By hand: bits 110 00110000 111001000 0000000 (+5 of padding), bytes from the low bit:
    # 11000110 -> 0x63, 00011100 -> 0x38, 10000000 -> 0x01, 0x00; Adler-32: a = 1 + 200,
    # b = 1 + 201.
    assert zlib_stream(data).hex() == "7801" + "63380100" + "00ca00c9"


def test_a_2x3_image_with_a_run_is_a_literal_and_a_match() -> None:
    # [[0, 0, 0], [0, 0, 7]]: scanlines 0 0 0 0 | 0 0 0 7: a run of 7 zeros, then a 7.
    data = bytes([0, 0, 0, 0, 0, 0, 0, 7])
    # The run: its byte, then 6 more copied from distance 1 (length 6: code 260, no extra).
    bits = HEADER + literal(0) + length(260) + DISTANCE_1 + literal(7) + END
    assert zlib_stream(data) == zlib_of(bits, data)


def test_a_match_with_extra_bits_writes_them_least_significant_first() -> None:
    data = bytes([0] + [5] * 22)  # 1x22, all 5: the 5 then a match of 21
    # Length 21: code 269 (19-22), two extra bits holding 21 - 19 = 2.
    bits = HEADER + literal(0) + literal(5) + length(269) + number(2, 2) + DISTANCE_1 + END
    assert zlib_stream(data) == zlib_of(bits, data)


@pytest.mark.parametrize(
    ("run", "matches"),
    [
        (3, []),  # 2 repeats: literals
        (4, [3]),
        (259, [258]),
        (260, [256, 3]),  # 259 = 256 + 3, not 258 + 1
        (261, [257, 3]),
        (262, [258, 3]),
        (263, [258, 4]),
        (517, [258, 258]),
        (518, [258, 256, 3]),
        (519, [258, 257, 3]),
        (520, [258, 258, 3]),
    ],
)
def test_a_run_is_a_literal_then_matches_of_258_and_the_rest(run: int, matches: list[int]) -> None:
    data = bytes([9] * run)
    codes = {n: deflate.LENGTH_BASE.index(max(b for b in deflate.LENGTH_BASE if b <= n))
             for n in range(3, 259)}  # fmt: skip
    bits = HEADER + literal(9) * (run if not matches else 1)
    for n in matches:
        index = codes[n]
        extra = deflate.LENGTH_EXTRA[index]
        bits += length(257 + index) + number(n - deflate.LENGTH_BASE[index], extra) + DISTANCE_1
    assert zlib_stream(data) == zlib_of(bits + END, data)
    assert zlib.decompress(zlib_stream(data)) == data


# -- against zlib and Pillow --------------------------------------------------------------


def scanlines(images: np.ndarray) -> np.ndarray:
    n, rows, cols = images.shape
    out = np.zeros((n, rows, cols + 1), np.uint8)
    out[:, :, 1:] = images
    return out.reshape(n, -1)


def check_streams(rows: np.ndarray, head: int = 0, tail: int = 0) -> list[bytes]:
    buffer, starts, ends = zlib_streams(rows, head, tail)
    assert buffer.dtype == np.uint8 and buffer.flags.writeable
    streams = []
    slot = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        assert start - head == slot  # each slot follows the one before
        slot = end + tail
        stream = buffer[start:end].tobytes()
        assert zlib.decompress(stream) == row.tobytes()
        assert stream[:2] == b"\x78\x01" and len(stream) <= max_stream_size(len(row))
        streams.append(stream)
    assert slot == len(buffer)
    return streams


@st.composite
def images(draw: st.DrawFn) -> np.ndarray:
    """Images of runs: every row a few blocks of one value each, some of them long."""
    rows = draw(st.integers(1, 300))
    cols = draw(st.integers(1, 300))
    count = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    flat = np.empty(count * rows * cols, np.uint8)
    done = 0
    while done < len(flat):
        size = int(rng.choice([1, 1, 2, 3, 4, rng.integers(1, 600), rng.integers(250, 530)]))
        flat[done : done + size] = rng.choice([0, 0, 255, int(rng.integers(0, 256))])
        done += size
    return flat.reshape(count, rows, cols)


@settings(max_examples=150, deadline=None)
@given(images())
def test_streams_inflate_to_the_scanlines_and_pngs_decode_to_the_images(
    batch: np.ndarray,
) -> None:
    streams = check_streams(scanlines(batch), head=3, tail=5)
    for image, stream in zip(batch, streams, strict=True):
        assert zlib_stream(scanlines(image[None])[0].tobytes()) == stream  # alone, the same
        with Image.open(io.BytesIO(encode_png(image))) as decoded:
            assert decoded.mode == "L"
            np.testing.assert_array_equal(np.asarray(decoded), image)


@pytest.mark.parametrize("value", [0, 255, 7])
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (1, 257), (1, 258), (1, 259), (1, 260),
                                            (1, 515), (1, 516), (2, 258), (9, 28), (300, 300)])  # fmt: skip
def test_constant_images(value: int, rows: int, cols: int) -> None:
    image = np.full((1, rows, cols), value, np.uint8)
    check_streams(scanlines(image))
    with Image.open(io.BytesIO(encode_png(image[0]))) as decoded:
        np.testing.assert_array_equal(np.asarray(decoded), image[0])


@pytest.mark.parametrize("run", [258, 259, 260, 261, 516, 517, 518, 1000, 5000])
def test_runs_of_every_remainder_and_across_rows(run: int) -> None:
    # A run of `run` zeros in the scanlines, crossing rows (each row's filter byte is 0).
    image = np.full(3 * 2000, 9, np.uint8)
    image[100 : 100 + run] = 0
    rows = scanlines(image.reshape(1, 60, 100))
    streams = check_streams(rows)
    flat = np.concatenate((np.zeros(1, np.uint8), image[:255]))
    check_streams(np.stack([flat, flat[::-1]]))
    assert len(streams) == 1


def test_a_row_longer_than_a_chunk_gives_the_bytes_of_one_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large image is coded in segments: the runs and the partial byte carried across
    give the same stream as coding it whole."""
    rng = np.random.default_rng(8)
    batch = (rng.integers(0, 4, (5, 90, 70)) * (rng.random((5, 90, 70)) < 0.2)).astype(np.uint8)
    batch[1, 10:60] = 0  # runs longer than a segment
    batch[2] = 0
    batch[3, :, :] = 200
    batch[4, 5:80] = 13
    rows = scanlines(batch)
    whole = check_streams(rows, head=2, tail=1)
    for chunk in (1000, 999, 258, 64, 7):
        monkeypatch.setattr(deflate, "CHUNK_BYTES", chunk)
        assert check_streams(rows, head=2, tail=1) == whole


def test_no_images_and_batches_of_any_size_give_the_same_streams() -> None:
    buffer, starts, ends = zlib_streams(np.zeros((0, 5), np.uint8))
    assert (len(buffer), len(starts), len(ends)) == (0, 0, 0)
    rng = np.random.default_rng(2)
    rows = scanlines(rng.integers(0, 3, (300, 20, 20), dtype=np.uint8) * 100)
    everything = check_streams(rows)
    for size in (1, 7, 100, 299):
        parts = [check_streams(rows[i : i + size]) for i in range(0, 300, size)]
        assert sum(parts, []) == everything


def test_the_fashion_test_set_inflates_to_its_scanlines() -> None:
    data = gzip.decompress(fashion_file("t10k-images-idx3-ubyte.gz").read_bytes())
    batch = np.frombuffer(data, np.uint8, offset=16).reshape(10000, 28, 28)
    rows = scanlines(batch)
    buffer, starts, ends = zlib_streams(rows)
    for row, start, end in zip(rows, starts, ends, strict=True):
        assert zlib.decompress(buffer[start:end].tobytes()) == row.tobytes()
    # ~521 bytes a stream (zlib's Z_RLE with dynamic codes: ~460); the bytes are pinned by
    # the digest of the converted test set (tests/formats/test_png.py).
    assert int((ends - starts).sum()) == FASHION_TEST_STREAM_BYTES


FASHION_TEST_STREAM_BYTES = 5208896
