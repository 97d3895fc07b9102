"""Whether a JPEG that does not end in its EOI marker is whole but for it (:func:`completed_jpeg`).

Caffe's ``cv::imread`` (OpenCV 4.6, libjpeg's ``jpeg_stdio_src``) reads a file that ends early
as if an EOI marker (FF D9) followed its last byte (the warning "Premature end of JPEG
file"), and libjpeg fills with zeros what the scans then lack: the missing rows grey, a
progressive image's missing refinements never made. A file missing nothing but its EOI (and
whatever came after it) is therefore read by Caffe as the complete image, the pixels of the
file with the EOI put back, and is read so here; every other short file stays refused.

Which of the two a file is, is decided exactly, by walking the Huffman codes of its scans as
libjpeg's entropy decoders do (``jdhuff.c``, ``jdphuff.c``), without decoding a coefficient's
value: the file is whole when

* its markers are the ones a baseline, extended or progressive Huffman JPEG has, each
  segment complete, and it ends at a segment's edge or at the end of a scan's data, maybe
  with the first byte (FF) of the missing EOI;
* every scan is whole: every MCU of it decoded within the scan's own bytes (every code and
  every extra bit present before the data ends or a marker comes: libjpeg never reads a
  zero it made up), restart markers exactly where and as numbered as libjpeg expects them,
  no byte left over before a marker;
* the scans give every coefficient of every component its last bit: each component
  scanned (sequential), each coefficient's successive approximation ended at bit 0
  (progressive), so a progressive file missing its later scans is not whole.

Anything else libjpeg would read otherwise than as written (a bad code, a run past the band,
a progression it warns of, a restart out of place, arithmetic coding, 12-bit samples, a DNL)
makes the answer "not whole", and the file is refused as it was before: exactness over reach.

Bounded on hostile input: a file of at most :data:`MAX_WALKED_BYTES`; time linear in its
bytes (every code is at least a bit) and in the blocks its scans cover (at most
:data:`_MAX_SCANNED_BLOCKS` counted over all scans, a progressive file's end-of-band runs
included); memory about 5 bytes a byte of a scan and, for a progressive file's
refinements, 8 bytes a block (at most :data:`_MAX_BLOCKS` blocks: an eighth of a byte a
pixel and component, what the decode itself needs many times over).
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Callable

from mnist2db.formats.jpeg_entropy import (
    HuffmanTable,
    ScanNotWhole,
    bit_windows,
    walk_ac_first,
    walk_ac_refine,
    walk_dc_first,
    walk_sequential,
)

#: The marker a JPEG ends with.
EOI = b"\xff\xd9"
#: The largest file walked (a longer one lacking its EOI stays refused). The walk is pure
#: Python: 1.9-5.3 MB/s of a core on noise (progressive, baseline), ~0.6 MB/s on a real
#: progressive photo, so at 16 MiB it ends well inside the workers' 60 s limit on one image
#: even on a loaded machine, and which files are completed does not depend on the machine's
#: speed (at 64 MiB a progressive photo could be completed on one and killed on another).
MAX_WALKED_BYTES = 1 << 24
#: The most blocks (all components) a walked frame declares.
_MAX_BLOCKS = 1 << 23
#: The most blocks all scans together may cover, each scan counting every block it covers
#: (a progressive file's end-of-band runs included): the walk's time beyond its bytes, about
#: 0.4-1.2 us a block in Python (12 MP: 282,000 blocks scanned sequential, 1.5 million
#: progressive; 0.3-1.5 s of a core),
#: so that, with :data:`MAX_WALKED_BYTES`, a walk ends well inside a worker's 60 s on one
#: image. A progressive photo of up to ~65 MP (libjpeg's usual ten scans, 4:2:0), a
#: sequential one of up to ~350 MP.
_MAX_SCANNED_BLOCKS = 1 << 23

#: libjpeg's largest MCU of an interleaved scan, in blocks (``D_MAX_BLOCKS_IN_MCU``).
_MAX_BLOCKS_IN_MCU = 10
#: A marker, with the fill bytes before it, ending a run of entropy-coded data.
_MARKER = re.compile(rb"\xff+[^\x00\xff]")
#: Fill bytes before a stuffed zero, which libjpeg reads as one FF data byte.
_ODD_STUFFING = re.compile(rb"\xff\xff+\x00")
#: Segments skipped as they are: DQT, APP0-15, COM.
_SKIPPED = frozenset((0xDB, *range(0xE0, 0xF0), 0xFE))


class _NotWhole(ScanNotWhole):
    """Something is missing, or is other than a walk can vouch for."""


def completed_jpeg(data: bytes) -> bytes | None:
    """``data`` with its EOI marker put back, when ``data`` is a JPEG whose scans are all
    whole and whose only missing part is that EOI (and whatever followed it): what Caffe's
    libjpeg reads from the file. None for any other bytes (a file that ends in its EOI
    costs a comparison)."""
    if not data.startswith(b"\xff\xd8") or data.endswith(EOI) or len(data) > MAX_WALKED_BYTES:
        return None
    try:
        _Walk(data).run()
    except (ScanNotWhole, IndexError, struct.error):
        return None
    return data + EOI


class _Component:
    def __init__(self, ident: int, h: int, v: int, width: int, height: int, hmax: int,
                 vmax: int) -> None:  # fmt: skip
        self.ident, self.h, self.v = ident, h, v
        self.blocks_wide = -(-width * h // (8 * hmax))
        self.blocks_high = -(-height * v // (8 * vmax))
        self.blocks = self.blocks_wide * self.blocks_high
        #: The successive approximation bit each coefficient has reached (-1: none yet).
        self.bits = [-1] * 64
        #: A progressive file's refinements: each block's coefficients made nonzero so far,
        #: a bit each (zigzag order), made when its first AC scan comes.
        self.nonzero: array[int] | None = None


class _Walk:
    """One file's markers and scans, walked as libjpeg reads them (:func:`completed_jpeg`)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.components: list[_Component] = []
        self.progressive = False
        self.width = self.height = self.mcus_wide = self.mcus_high = 0
        self.tables: dict[tuple[int, int], HuffmanTable] = {}
        self.restart_interval = 0
        self.unscanned_blocks = _MAX_SCANNED_BLOCKS

    def run(self) -> None:
        """Return when the file is whole but for its EOI.

        Raises:
            _NotWhole: it is not (or it cannot be vouched for).
        """
        data, end, at = self.data, len(self.data), 2
        while at < end:
            if data[at] != 0xFF:
                raise _NotWhole  # bytes between segments
            while at < end and data[at] == 0xFF:
                at += 1
            if at == end:
                break  # the EOI's first byte
            marker = data[at]
            if at + 3 > end:
                raise _NotWhole
            (length,) = struct.unpack(">H", data[at + 1 : at + 3])
            body_at, at = at + 3, at + 1 + length
            if length < 2 or at > end:
                raise _NotWhole
            body = data[body_at:at]
            if marker in (0xC0, 0xC1, 0xC2):
                self._frame(body, progressive=marker == 0xC2)
            elif marker == 0xC4:
                self._huffman_tables(body)
            elif marker == 0xDD:
                if len(body) != 2:
                    raise _NotWhole
                (self.restart_interval,) = struct.unpack(">H", body)
            elif marker == 0xDA:
                at = self._scan(body, at)
            elif marker not in _SKIPPED:
                raise _NotWhole  # EOI, SOI, RST, DNL, arithmetic, lossless, 12-bit, ...
        if not self.components or any(b != 0 for c in self.components for b in c.bits):
            raise _NotWhole  # not every coefficient has its last bit: scans are missing

    def _frame(self, body: bytes, *, progressive: bool) -> None:
        if self.components or len(body) < 6 or body[0] != 8:
            raise _NotWhole
        height, width, count = struct.unpack(">HHB", body[1:6])
        if not (height and width and 1 <= count <= 4 and len(body) == 6 + 3 * count):
            raise _NotWhole
        fields = [body[6 + 3 * i : 9 + 3 * i] for i in range(count)]
        factors = [(f[1] >> 4, f[1] & 15) for f in fields]
        if any(not (1 <= h <= 4 and 1 <= v <= 4) for h, v in factors) or any(
            f[2] > 3 for f in fields
        ):
            raise _NotWhole
        if len({f[0] for f in fields}) != count:
            raise _NotWhole
        hmax, vmax = max(h for h, _ in factors), max(v for _, v in factors)
        self.components = [
            _Component(f[0], h, v, width, height, hmax, vmax)
            for f, (h, v) in zip(fields, factors, strict=True)
        ]
        if sum(c.blocks for c in self.components) > _MAX_BLOCKS:
            raise _NotWhole
        self.progressive, self.width, self.height = progressive, width, height
        self.mcus_wide = -(-width // (8 * hmax))
        self.mcus_high = -(-height // (8 * vmax))

    def _huffman_tables(self, body: bytes) -> None:
        at = 0
        while at < len(body):
            kind, ident = body[at] >> 4, body[at] & 15
            counts = body[at + 1 : at + 17]
            if kind > 1 or ident > 3 or len(counts) != 16:
                raise _NotWhole
            total = sum(counts)
            symbols = body[at + 17 : at + 17 + total]
            if total > 256 or len(symbols) != total:
                raise _NotWhole
            self.tables[kind, ident] = HuffmanTable(counts, symbols)
            at += 17 + total

    def _table(self, kind: int, ident: int) -> HuffmanTable:
        table = self.tables.get((kind, ident))
        if table is None:
            raise _NotWhole  # libjpeg-turbo would use a default table: not vouched for
        return table

    def _scan(self, body: bytes, at: int) -> int:
        """Walk the scan whose header is ``body`` and whose data starts at ``at``; return
        where its data ends (the next marker, or the end of the file)."""
        if not self.components or not body or len(body) != 4 + 2 * body[0]:
            raise _NotWhole
        count = body[0]
        selected = []
        for i in range(count):
            ident, tables = body[1 + 2 * i], body[2 + 2 * i]
            found = [c for c in self.components if c.ident == ident]
            if not found:
                raise _NotWhole
            selected.append((found[0], tables >> 4, tables & 15))
        order = [self.components.index(c) for c, _, _ in selected]
        if order != sorted(set(order)) or not 1 <= count <= 4:
            raise _NotWhole  # a component twice, or out of the frame's order
        start, stop, ah, al = body[-3], body[-2], body[-1] >> 4, body[-1] & 15
        self._progression(selected, start, stop, ah, al)
        mcus = self._mcus(selected)
        self.unscanned_blocks -= mcus * (
            1 if count == 1 else sum(c.h * c.v for c, _, _ in selected)
        )
        if self.unscanned_blocks < 0:
            raise _NotWhole  # more blocks than a walk may take the time for
        segments, end = self._segments(at, mcus)
        walk = self._walk_for(selected, start, stop, ah)
        parts = [self.data[s:e].replace(b"\xff\x00", b"\xff") for s, e, _ in segments]
        windows = bit_windows(b"".join(parts))
        offset = 0
        for part, (_, _, mcus) in zip(parts, segments, strict=True):
            bits = walk(windows, 8 * offset, mcus)
            offset += len(part)
            if (bits + 7) >> 3 != offset:
                raise _NotWhole  # short (codes past its end), or bytes left over
        return end

    def _progression(self, selected: list[tuple[_Component, int, int]], start: int, stop: int,
                     ah: int, al: int) -> None:  # fmt: skip
        """Check the scan's place in the file's coefficients, as libjpeg does (an error or
        a warning there: not whole), and record the bits it brings."""
        if not self.progressive:
            if (start, stop, ah, al) != (0, 63, 0, 0):
                raise _NotWhole  # libjpeg's JWRN_NOT_SEQUENTIAL
            for component, _, _ in selected:
                if component.bits[0] != -1:
                    raise _NotWhole  # a component scanned twice
                component.bits = [0] * 64
            return
        if start == 0:
            if stop != 0:
                raise _NotWhole
        elif stop < start or stop > 63 or len(selected) != 1:
            raise _NotWhole
        if (ah != 0 and al != ah - 1) or al > 13:
            raise _NotWhole
        for component, _, _ in selected:
            if start > 0 and component.bits[0] < 0:
                raise _NotWhole  # AC before DC: libjpeg's JWRN_BOGUS_PROGRESSION
            for k in range(start, stop + 1):
                if ah != max(component.bits[k], 0):
                    raise _NotWhole
                component.bits[k] = al

    def _mcus(self, selected: list[tuple[_Component, int, int]]) -> int:
        if len(selected) == 1:
            return selected[0][0].blocks
        if sum(c.h * c.v for c, _, _ in selected) > _MAX_BLOCKS_IN_MCU:
            raise _NotWhole
        return self.mcus_wide * self.mcus_high

    def _segments(self, at: int, mcus: int) -> tuple[list[tuple[int, int, int]], int]:
        """The scan's restart intervals, ``(start, end, MCUs)`` of each one's bytes (still
        stuffed), all of them, and where the scan's data ends."""
        data, interval = self.data, self.restart_interval
        expected = -(-mcus // interval) if interval else 1
        segments: list[tuple[int, int, int]] = []
        search = begin = at
        while True:
            done = len(segments) * interval
            here = min(interval, mcus - done) if interval else mcus
            found = _MARKER.search(data, search)
            if found is None:
                end = finish = len(data)
                while end > begin and data[end - 1] == 0xFF:
                    end -= 1  # the EOI's first byte, and any fill before it
                segments.append((begin, end, here))
                if len(segments) != expected:
                    raise _NotWhole  # the file ends before the scan's last interval
                break
            segments.append((begin, found.start(), here))
            marker = data[found.end() - 1]
            if marker & 0xF8 == 0xD0:
                if len(segments) >= expected or marker != 0xD0 + (len(segments) - 1) % 8:
                    raise _NotWhole  # a restart where none is due, or misnumbered
                search = begin = found.end()
                continue
            if len(segments) != expected:
                raise _NotWhole  # a marker before the scan's last interval
            end = finish = found.start()
            break
        if _ODD_STUFFING.search(data, at, end):
            raise _NotWhole
        return segments, finish

    def _walk_for(self, selected: list[tuple[_Component, int, int]], start: int, stop: int,
                  ah: int) -> Callable[[array[int], int, int], int]:  # fmt: skip
        """The walk of one restart interval of this scan: ``walk(windows, bit, mcus)`` returns
        the bit after the interval's last code, from its first at ``bit``."""
        each = len(selected) == 1  # non-interleaved: an MCU is one block
        per_mcu = [(c, dc, ac) for c, dc, ac in selected for _ in range(1 if each else c.h * c.v)]
        if not self.progressive:
            blocks = [
                (self._table(0, dc).lookup("dc"), self._table(1, ac).lookup("sequential"))
                for _, dc, ac in per_mcu
            ]
            return lambda windows, bit, mcus: walk_sequential(windows, bit, mcus, blocks)
        if start == 0 and ah:
            return lambda windows, bit, mcus: bit + mcus * len(per_mcu)  # a bit a block
        if start == 0:
            luts = [self._table(0, dc).lookup("dc") for _, dc, _ in per_mcu]
            return lambda windows, bit, mcus: walk_dc_first(windows, bit, mcus, luts)
        component, _, ac = selected[0]
        lut = self._table(1, ac).lookup("progressive")
        if component.nonzero is None:
            component.nonzero = array("Q", [0]) * component.blocks
        nonzero = component.nonzero
        first = [0]  # the interval's first block

        def walk(windows: array[int], bit: int, mcus: int) -> int:
            block = first[0]
            first[0] += mcus
            if ah:
                return walk_ac_refine(windows, bit, block, block + mcus, start, stop, lut, nonzero)
            return walk_ac_first(windows, bit, block, block + mcus, start, stop, lut, nonzero)

        return walk
