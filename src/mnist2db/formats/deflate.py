"""zlib streams written by numpy: PNG's "fast" compression (``--png-compression fast``).

Each image's filtered scanlines become ONE final deflate block with the FIXED Huffman codes
of RFC 1951 (BTYPE 01), its tokens a greedy run-length coding: every run of one repeated
byte is a literal, then distance-1 matches of 258 bytes and a last one of 3 to 258 (a
remainder of 1 or 2 after the 258s makes the piece before it 255 or 256 and the last 3);
a run with fewer than 3 repeats after its literal is literals. The stream is wrapped as
zlib wraps it: the header ``78 01``, then the Adler-32 of the scanlines, big-endian.

Why: zlib builds a dynamic Huffman tree for every block, most of its ~23 µs per 28×28
image even in C, and an inflater builds it again (5.5 µs an image against 2.5 for fixed
codes, the same pixels). Fixed codes cost ~13% in size on Fashion-MNIST
(docs/performance.md). And the bytes are a function of the image alone: the same whatever
the zlib version, the machine, the batch or the threads.

Everything is vectorized over a chunk of images (no Python per token or byte): runs from
the positions where a byte differs from the one before, each run's leading codes from one
table lookup (:func:`_tables`), bit offsets by a cumulative sum, packing into 64-bit words
by another (:func:`_pack`). Chunks hold at most :data:`CHUNK_BYTES` scanline bytes; a
larger image is coded in segments of that size, its pending run and partial byte carried
from one to the next, so the work arrays stay within ~13 MB whatever the image.
"""

from __future__ import annotations

import zlib

from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


#: zlib's header for these streams: deflate with a 32 KiB window, "fastest" level, no
#: dictionary (0x7801 is a multiple of 31, as RFC 1950 asks).
ZLIB_HEADER = b"\x78\x01"
#: Scanline bytes coded at once. Each run costs about 100 bytes of work arrays, a run at
#: most one byte: 128 KiB keeps them ~13 MB at worst (~5 MB on MNIST's images, ~150 a
#: chunk), and numpy's ~1 µs a call is then a small part of the work.
CHUNK_BYTES = 1 << 17
#: Deflate's largest expansion: a 258-byte match from 2 bits. No deflate stream of N bytes
#: inflates to more than about ``INFLATE_RATIO * N`` bytes (what bounds a gzip file's or a
#: PNG's contents before they are inflated).
INFLATE_RATIO = 1032

#: RFC 1951 3.2.5: the length codes 257-285, the first length of each and its extra bits.
LENGTH_BASE = (3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59,
               67, 83, 99, 115, 131, 163, 195, 227, 258)  # fmt: skip
LENGTH_EXTRA = (0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                5, 5, 5, 5, 0)  # fmt: skip
#: The block header (BFINAL 1, BTYPE 01, least significant bit first) and its width.
_HEADER, _HEADER_BITS = 0b011, 3
#: End of block: code 256, seven 0 bits.
_EOB_BITS = 7
#: Table rows: runs of 1 … 261 bytes exactly, and 262 for every longer run's first item.
_ROWS = 263
_LONG = 260  # the first run length with more than one match (259 repeats after its literal)

_cache: list[tuple[np.ndarray, ...]] = []


def _keep_freed_memory() -> None:
    """Let the allocator keep the chunks' work arrays for the next chunk.

    glibc maps blocks above its mmap threshold (128 KiB at start) from the system and
    unmaps them when freed, so every chunk's arrays would be fresh pages: ~6 page faults
    per 28×28 image, as much time as the coding itself (measured). Freeing one mapped
    block raises the threshold to its size, and the heap's trim threshold to twice that
    (glibc's documented dynamic threshold, mallopt(3)); then blocks up to 8 MiB are reused
    from the heap. Any program that frees a large numpy array does the same; on other
    allocators this costs one allocation and changes nothing.
    """
    import numpy as np

    np.empty(8 << 20, np.uint8)


def _reverse(code: int, bits: int) -> int:
    """Huffman codes go out most significant bit first; everything else least first."""
    return int(f"{code:0{bits}b}"[::-1], 2)


def _tables() -> tuple[np.ndarray, ...]:
    """``(first_value, first_bits, match_value, match_bits)``, built once.

    ``first_*[(min(run, 262) << 8) | byte]``: the codes a run starts with, as one integer
    of at most 27 bits to write least significant bit first: its literal, then either the
    literal again (runs of 2 and 3) or its first match with distance 1. ``match_*[n]``:
    one match of length ``n`` (3 … 258) with distance 1 (code 0, five 0 bits).
    """
    if _cache:
        return _cache[0]
    import numpy as np

    _keep_freed_memory()

    lit_value = np.zeros(256, np.uint64)
    lit_bits = np.zeros(256, np.int64)
    for byte in range(256):
        code, width = (0x30 + byte, 8) if byte < 144 else (0x190 + byte - 144, 9)
        lit_value[byte], lit_bits[byte] = _reverse(code, width), width
    match_value = np.zeros(259, np.uint64)
    match_bits = np.zeros(259, np.int64)
    for length in range(3, 259):
        index = max(i for i, base in enumerate(LENGTH_BASE) if base <= length)
        symbol, extra = 257 + index, LENGTH_EXTRA[index]
        code, width = (symbol - 256, 7) if symbol < 280 else (0xC0 + symbol - 280, 8)
        match_value[length] = _reverse(code, width) | (length - LENGTH_BASE[index]) << width
        match_bits[length] = width + extra + 5  # distance code 0: five 0 bits
    run = np.arange(_ROWS)[:, None]
    first_match = np.clip(run - 1, 0, 258)  # runs of 4 … 259: one match of run - 1
    first_match[260:262, 0] = (256, 257)  # 259 + r = 255 + r, then 3 (r = 1, 2)
    value = np.zeros((_ROWS, 256), np.uint64)
    bits = np.zeros((_ROWS, 256), np.int64)
    shift = lit_bits.astype(np.uint64)
    for copies in (1, 2, 3):  # runs of 1 … 3: literals
        value[copies] = sum(lit_value << (shift * np.uint64(i)) for i in range(copies))
        bits[copies] = copies * lit_bits
    value[4:] = lit_value | match_value[first_match[4:]] << shift
    bits[4:] = lit_bits + match_bits[first_match[4:]]
    _cache.append((value.ravel(), bits.ravel(), match_value, match_bits))
    return _cache[0]


# -- runs and their codes -----------------------------------------------------------------


def _runs(flat: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, lengths, bytes)`` of the maximal runs of one byte in ``flat``; a run never
    crosses a multiple of ``size`` (the start of an image)."""
    import numpy as np

    change = np.empty(len(flat), bool)
    np.not_equal(flat[1:], flat[:-1], out=change[1:])
    change[::size] = True
    starts = change.nonzero()[0]
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = len(flat) - starts[-1]
    return starts, lengths, np.take(flat, starts)


class _Codes:
    """The codes of a sequence of runs, in order, with the block headers and ends asked for.

    ``value``: each run's first codes (at most 30 bits: a header, a literal and a match);
    ``span``: the bits of the whole run (its long matches and a block end included). The
    runs of 260 bytes or more (``long``, in order) go on with ``count`` more matches each:
    ``more_value``/``more_bits``, concatenated in order.
    """

    def __init__(
        self, lengths: np.ndarray, values: np.ndarray, firsts: np.ndarray, lasts: np.ndarray
    ) -> None:
        import numpy as np

        first_value, first_bits, match_value, match_bits = _tables()
        index = np.minimum(lengths, _ROWS - 1)
        index <<= 8
        index |= values
        self.value, self.span = np.take(first_value, index), np.take(first_bits, index)
        self.value[firsts] = self.value[firsts] << np.uint64(_HEADER_BITS) | np.uint64(_HEADER)
        self.span[firsts] += _HEADER_BITS
        self.long = np.flatnonzero(lengths >= _LONG)
        self.own = self.span[self.long]  # the bits before a long run's other matches
        self.span[lasts] += _EOB_BITS
        if not len(self.long):
            return
        repeats = lengths[self.long] - 1
        whole, rest = np.divmod(repeats, 258)
        self.count = whole + (rest > 0) - 1  # matches after the first (in the table)
        run = np.repeat(np.arange(len(self.long)), self.count)
        self.begins = np.cumsum(self.count) - self.count  # each long run's first in `more`
        k = np.arange(len(run)) - self.begins[run] + 1  # the match's place in its run, from 0
        w, r = whole[run], rest[run]
        length = np.full(len(run), 258, np.int64)
        small = (r == 1) | (r == 2)  # 258 … 258, 255 + r, 3
        before = small & (k == w - 1)
        length[before] = 255 + r[before]
        length[small & (k == w)] = 3
        tail = ~small & (k == w)  # 258 … 258, r (3 … 257)
        length[tail] = r[tail]
        self.more_value, self.more_bits = np.take(match_value, length), np.take(match_bits, length)
        self.span[self.long] += np.add.reduceat(self.more_bits, self.begins)

    def pack(self, words: np.ndarray, offsets: np.ndarray) -> None:
        """OR the codes into ``words`` (little-endian 64-bit), run ``i`` at bit ``offsets[i]``
        (the codes and ``offsets`` are used up)."""
        import numpy as np

        if len(self.long):
            more = np.cumsum(self.more_bits) - self.more_bits
            start = offsets[self.long] + self.own - more[self.begins]
            more += np.repeat(start, self.count)
            _pack(words, self.more_value, more)
        _pack(words, self.value, offsets)


def _pack(words: np.ndarray, value: np.ndarray, offsets: np.ndarray) -> None:
    """OR codes of at most 64 bits each, at increasing bit offsets that leave them apart,
    into ``words``; ``value`` and ``offsets`` are used up (overwritten).

    The codes that start in one word have disjoint bits, so their OR is their sum: one
    cumulative sum (modulo 2^64, exact for the differences) gives every word's at once.
    Only the last code starting in a word can run over into the next.
    """
    import numpy as np

    if not len(value):
        return
    word = offsets >> 6
    last = (word[1:] != word[:-1]).nonzero()[0]  # the last code of each word but the final
    last = np.append(last, len(word) - 1)
    target = np.take(word, last)
    top = np.take(value, last)
    shift = np.bitwise_and(offsets.view(np.uint64), np.uint64(63), out=offsets.view(np.uint64))
    np.left_shift(value, shift, out=value)
    low = np.cumsum(value, out=value)
    sums = np.take(low, last)
    sums[1:] -= sums[:-1].copy()
    words[target] |= sums
    # A shift of 64 would wrap: shift by one, then by 63 - shift.
    words[target + 1] |= (top >> np.uint64(1)) >> (np.uint64(63) - np.take(shift, last))


def _bytes_of(words: np.ndarray) -> np.ndarray:
    """The words' bytes, least significant first (deflate's bit order), whatever the machine."""
    import numpy as np

    return words.astype("<u8", copy=False).view(np.uint8)


# -- whole streams ------------------------------------------------------------------------


def max_stream_size(size: int) -> int:
    """The most bytes the zlib stream of ``size`` bytes can take: every byte a literal of
    at most 9 bits (a match of n >= 3 bytes takes at most 18), the block's header and end,
    zlib's header and checksum."""
    return (_HEADER_BITS + 9 * size + _EOB_BITS + 7) // 8 + len(ZLIB_HEADER) + 4


def zlib_streams(
    scanlines: np.ndarray, head: int = 0, tail: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The zlib stream of each row of ``scanlines``, one after the other in one buffer.

    Args:
        scanlines: uint8 ``(n, size)``, ``size`` ≥ 1: each row the bytes to compress (a
            PNG's filtered scanlines).
        head, tail: bytes left free (0) before and after each stream, for its container
            (a PNG chunk's length and type, its CRC).

    Returns:
        ``(buffer, starts, ends)``: a writable uint8 array and each stream's first byte and
        end in it; row ``i``'s slot, ``buffer[starts[i] - head : ends[i] + tail]``, follows
        the one before it.
    """
    import numpy as np

    n, size = scanlines.shape
    if n == 0:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, np.uint8), empty, empty
    parts = []
    per = max(1, CHUNK_BYTES // size)
    for i in range(0, n, per):
        rows = scanlines[i : i + per]
        parts.append(
            _chunk(rows, head, tail)
            if size <= CHUNK_BYTES
            else _large(np.ascontiguousarray(rows[0]), head, tail)
        )
    if len(parts) == 1:
        return parts[0]
    shifts = np.cumsum([0] + [len(part[0]) for part in parts[:-1]])
    return (
        np.concatenate([part[0] for part in parts]),
        np.concatenate([part[1] + shift for part, shift in zip(parts, shifts, strict=True)]),
        np.concatenate([part[2] + shift for part, shift in zip(parts, shifts, strict=True)]),
    )


def zlib_stream(data: bytes) -> bytes:
    """The zlib stream of ``data`` (not empty): the same bytes :func:`zlib_streams` gives."""
    import numpy as np

    buffer, starts, ends = zlib_streams(np.frombuffer(data, np.uint8).reshape(1, -1))
    return buffer[starts[0] : ends[0]].tobytes()


def _chunk(rows: np.ndarray, head: int, tail: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`zlib_streams` of rows that fit in one chunk, all at once."""
    import numpy as np

    n, size = rows.shape
    flat = np.ascontiguousarray(rows).reshape(-1)
    starts, lengths, values = _runs(flat, size)
    firsts = np.searchsorted(starts, np.arange(n) * size)
    lasts = np.empty_like(firsts)
    lasts[:-1] = firsts[1:] - 1
    lasts[-1] = len(starts) - 1
    codes = _Codes(lengths, values, firsts, lasts)
    totals = np.add.reduceat(codes.span, firsts)  # each stream's bits
    data = (totals + 7) >> 3
    slot_ends = np.cumsum(data + (head + len(ZLIB_HEADER) + 4 + tail))
    begin = slot_ends - data - (4 + tail)  # each stream's first deflate byte
    # Move each stream to its byte: the gap after the last run of the one before.
    span = codes.span
    span[lasts[:-1]] += 8 * (begin[1:] - begin[:-1]) - totals[:-1]
    span[0] += 8 * int(begin[0])  # then the sums before each run are its offset
    offsets = np.empty_like(span)
    offsets[0] = 8 * int(begin[0])
    np.cumsum(span[:-1], out=offsets[1:])
    words = np.zeros(int(slot_ends[-1]) // 8 + 2, np.uint64)
    codes.pack(words, offsets)
    buffer = _bytes_of(words)[: int(slot_ends[-1])]
    buffer[begin - 2] = ZLIB_HEADER[0]
    buffer[begin - 1] = ZLIB_HEADER[1]
    view = flat.data
    adlers = np.array(
        [zlib.adler32(view[i : i + size]) for i in range(0, n * size, size)], ">u4"
    ).view(np.uint8)
    ends = begin + data + 4
    buffer[(ends - 4)[:, None] + np.arange(4)] = adlers.reshape(n, 4)
    return buffer, begin - 2, ends


def _large(row: np.ndarray, head: int, tail: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`zlib_streams` of one row longer than a chunk, a chunk at a time: the run still
    going at a chunk's end waits for the next, and so does the last partial byte."""
    import numpy as np

    parts = [bytes(head), ZLIB_HEADER]
    carry, carry_bits = 0, 0  # the partial byte
    pending: tuple[int, int] | None = None  # (byte, length) of the run going on
    begun = False  # the block header written
    size = len(row)
    for start in range(0, size, CHUNK_BYTES):
        stop = min(size, start + CHUNK_BYTES)
        segment = row[start:stop]
        _, lengths, values = _runs(segment, len(segment))
        if pending is not None:
            if values[0] == pending[0]:
                lengths[0] += pending[1]
            else:
                lengths = np.concatenate(([pending[1]], lengths))
                values = np.concatenate(([pending[0]], values)).astype(np.uint8)
        final = stop == size
        if not final:
            pending = (int(values[-1]), int(lengths[-1]))
            lengths, values = lengths[:-1], values[:-1]
            if not len(lengths):
                continue
        none = np.zeros(0, np.int64)
        last = np.array([len(lengths) - 1]) if final else none
        codes = _Codes(lengths, values, none if begun else np.array([0]), last)
        begun = True
        offsets = np.cumsum(codes.span)
        total = int(offsets[-1]) + carry_bits
        offsets -= codes.span
        offsets += carry_bits
        words = np.zeros(total // 64 + 2, np.uint64)
        words[0] = carry
        codes.pack(words, offsets)
        buffer = _bytes_of(words)
        full = (total + 7) // 8 if final else total // 8
        parts.append(buffer[:full].tobytes())
        carry, carry_bits = int(buffer[full]), total % 8
    parts += [zlib.adler32(row.data).to_bytes(4, "big"), bytes(tail)]
    buffer = np.frombuffer(bytearray(b"".join(parts)), np.uint8)
    return buffer, np.array([head]), np.array([len(buffer) - tail])
