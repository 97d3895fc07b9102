"""The Huffman codes of one JPEG scan's restart interval walked as libjpeg's entropy decoders
read them (``jdhuff.c``'s ``decode_mcu``, ``jdphuff.c``'s four progressive passes), to the
bit after its last code, without decoding a coefficient's value: what
:mod:`mnist2db.formats.jpeg_scans` asks of every scan of a JPEG that lacks its EOI.

Each walk peeks 16 bits at a time through :func:`bit_windows` and a :class:`HuffmanTable`'s
lookups; a code the table does not hold, a run past the block or the band, an end-of-band
run past the interval, raise :class:`ScanNotWhole`, as does reading past the data
(``IndexError`` from the windows: the caller's). Time: a few operations a code, and a block
of an end-of-band run at numpy's speed.
"""

from __future__ import annotations

from array import array

import numpy as np

#: Each lookup's array type and its entry for a code the table does not hold.
_LOOKUP_KINDS = {"dc": ("B", 64), "sequential": ("H", 127 << 6), "progressive": ("h", -1)}


class ScanNotWhole(Exception):
    """A scan's codes are not all there, or not as libjpeg would read them as written."""


class HuffmanTable:
    """A Huffman table (DHT) and the lookups the walks use, made when first used: each maps
    the next 16 bits of the data to what the code they begin with means."""

    def __init__(self, counts: bytes, symbols: bytes) -> None:
        self.codes: list[tuple[int, int, int]] = []  # (length, code, symbol)
        code, at = 0, 0
        for length in range(1, 17):
            for _ in range(counts[length - 1]):
                self.codes.append((length, code, symbols[at]))
                code += 1
                at += 1
            if code >= 1 << length:  # libjpeg's JERR_BAD_HUFF_TABLE (no all-ones code)
                raise ScanNotWhole
            code <<= 1
        self._lookups: dict[str, array[int]] = {}

    def lookup(self, use: str) -> array[int]:
        """``"dc"``: code length + the extra bits' count (bits 0-5; 64 for no code);
        ``"sequential"``: code length + extra bits (bits 0-4), end of block (bit 5), the
        coefficients advanced (bits 6-; 127 for no code, past any block);
        ``"progressive"``: code length (bits 0-4), the run (5-8), the size (9-); -1 for no
        code. Small integers in an array: 64 to 128 KiB a lookup."""
        made = self._lookups.get(use)
        if made is None:
            made = self._lookups[use] = self._make(use)
        return made

    def _make(self, use: str) -> array[int]:
        kind, invalid = _LOOKUP_KINDS[use]
        entries = np.full(1 << 16, invalid, np.int64)
        for length, code, symbol in self.codes:
            run, size = symbol >> 4, symbol & 15
            if use == "dc":
                if symbol > 15:  # libjpeg's JERR_BAD_HUFF_TABLE for a DC table
                    raise ScanNotWhole
                value = length + symbol
            elif use == "sequential":
                if size:
                    value = (length + size) | (run + 1) << 6
                elif run == 0:
                    value = length | 1 << 5
                elif run == 15:
                    value = length | 16 << 6
                else:
                    continue  # an EOB run in a sequential scan: left invalid
            else:
                value = length | run << 5 | size << 9
            shift = 16 - length
            entries[code << shift : (code + 1) << shift] = value
        return array(kind, entries.astype(kind).tobytes())


def bit_windows(unstuffed: bytes) -> array[int]:
    """Each byte's 32-bit window (it and the next three, zeros past the end), for the walks'
    16-bit peeks at any bit: ``(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF``."""
    padded = np.frombuffer(unstuffed + b"\x00\x00\x00", np.uint8)
    made = array("I")
    step = 1 << 16  # numpy's temporaries a few hundred KiB
    for first in range(0, len(unstuffed), step):
        part = padded[first : first + step + 3].astype(np.uint32)
        n = len(part) - 3
        word = part[:n] << 24 | part[1 : n + 1] << 16 | part[2 : n + 2] << 8 | part[3 : n + 3]
        made.frombytes(word.astype(np.uint32).tobytes())
    return made


def walk_sequential(
    windows: array[int], bit: int, mcus: int, blocks: list[tuple[array[int], array[int]]]
) -> int:
    """A sequential scan's interval: per block, its DC code and extra bits, then AC codes
    and their extra bits to the end of block or the 63rd coefficient."""
    for _ in range(mcus):
        for dc, ac in blocks:
            entry = dc[(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF]
            bit += entry & 63
            k = 1 + (entry & 64)  # past the block when no code: refused below
            while k < 64:
                entry = ac[(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF]
                bit += entry & 31
                if entry & 32:
                    break
                k += entry >> 6
            if k > 64:
                raise ScanNotWhole  # no such code, or a run past the block
    return bit


def walk_dc_first(windows: array[int], bit: int, mcus: int, luts: list[array[int]]) -> int:
    for _ in range(mcus):
        for dc in luts:
            entry = dc[(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF]
            if entry > 63:
                raise ScanNotWhole
            bit += entry
    return bit


def walk_ac_first(windows: array[int], bit: int, block: int, end: int, start: int, stop: int,
              lut: array[int], nonzero: array[int]) -> int:  # fmt: skip
    """A progressive AC scan's first pass (``decode_mcu_AC_first``) over blocks
    ``block``..``end`` of one component: which coefficients it makes nonzero, recorded."""
    run = 0
    while block < end:
        if run:
            skipped = min(run, end - block)
            block += skipped
            run -= skipped
            continue
        k, made = start, 0
        while k <= stop:
            entry = lut[(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF]
            if entry < 0:
                raise ScanNotWhole
            bit += entry & 31
            r, size = (entry >> 5) & 15, entry >> 9
            if size:
                k += r
                if k > stop:
                    raise ScanNotWhole
                bit += size
                made |= 1 << k
                k += 1
            elif r == 15:
                k += 16
                if k > stop + 1:
                    raise ScanNotWhole
            else:
                run = 1 << r
                if r:
                    run += (windows[bit >> 3] >> (32 - (bit & 7) - r)) & ((1 << r) - 1)
                    bit += r
                run -= 1
                break
        if made:
            nonzero[block] |= made
        block += 1
    if run:
        raise ScanNotWhole  # an end-of-band run past the interval
    return bit


def walk_ac_refine(windows: array[int], bit: int, block: int, end: int, start: int, stop: int,
               lut: array[int], nonzero: array[int]) -> int:  # fmt: skip
    """A progressive AC scan's refinement (``decode_mcu_AC_refine``): a correction bit for
    each coefficient already nonzero in the band, the codes of those it makes nonzero."""
    band = ((1 << (stop + 1)) - 1) ^ ((1 << start) - 1)
    run = 0
    while block < end:
        if run:
            covered = min(run, end - block)
            bit += _corrections(nonzero, block, block + covered, band)
            block += covered
            run -= covered
            continue
        mask, k = nonzero[block], start
        while k <= stop:
            entry = lut[(windows[bit >> 3] >> (16 - (bit & 7))) & 0xFFFF]
            if entry < 0:
                raise ScanNotWhole
            bit += entry & 31
            r, size = (entry >> 5) & 15, entry >> 9
            if size:
                if size != 1:
                    raise ScanNotWhole  # libjpeg's JWRN_HUFF_BAD_CODE
                bit += 1
            elif r != 15:
                run = 1 << r
                if r:
                    run += (windows[bit >> 3] >> (32 - (bit & 7) - r)) & ((1 << r) - 1)
                    bit += r
                break
            while k <= stop:  # past the nonzero (a correction bit each) and r zeros
                if mask >> k & 1:
                    bit += 1
                elif r:
                    r -= 1
                else:
                    break
                k += 1
            else:
                raise ScanNotWhole  # the zero it names is past the band
            if size:
                mask |= 1 << k
            k += 1
        if run:
            bit += (mask & band & ~((1 << k) - 1)).bit_count()
            run -= 1
        nonzero[block] = mask
        block += 1
    if run:
        raise ScanNotWhole
    return bit


def _corrections(nonzero: array[int], block: int, end: int, band: int) -> int:
    """The correction bits of blocks ``block``..``end`` in an end-of-band run: one for each
    coefficient of the band already nonzero."""
    if end - block < 16:
        return sum((nonzero[i] & band).bit_count() for i in range(block, end))
    masks = np.frombuffer(nonzero, np.uint64)[block:end] & np.uint64(band)
    return int(np.unpackbits(masks.view(np.uint8)).sum())
