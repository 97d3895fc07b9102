"""Test helpers for LMDB's pages, read with struct (not mnist2db's walk): where the meta
pages, the main database's tree and its overflow records are in a data.mdb, to damage them.
The layout is liblmdb's (mdb.c) on a 64-bit machine: MDB_page is mp_pgno (8 bytes), mp_pad,
mp_flags, mp_lower, mp_upper (2 each), then mp_ptrs; MDB_node is mn_lo, mn_hi, mn_flags,
mn_ksize, then the key and the data."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096
HEADER = 16
META = struct.Struct("@IINN" + "IHH5N" * 2 + "NN")
#: Byte offsets, in a meta page, of the main database's fields (MDB_db after the free one).
MAIN_AT = HEADER + 24 + 48
MAIN_FIELDS = {
    "flags": 4,
    "depth": 6,
    "branch": 8,
    "leaf": 16,
    "overflow": 24,
    "entries": 32,
    "root": 40,
}


@dataclass
class Layout:
    """The pages of a data.mdb: the newer meta page, branch and leaf pages, and for each
    leaf node its page, offset and whether its value is on overflow pages."""

    meta: int  # 0 or 1: the meta page liblmdb reads
    last_page: int
    root: int
    branches: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    nodes: list[tuple[int, int, bool]] = field(default_factory=list)  # (page, offset, big)
    overflow: list[int] = field(default_factory=list)  # each overflow record's first page


def read_layout(data: bytes) -> Layout:
    metas = [META.unpack_from(data, page * PAGE + HEADER) for page in (0, 1)]
    chosen = 1 if metas[1][-1] > metas[0][-1] else 0
    fields = metas[chosen]
    layout = Layout(chosen, fields[20], fields[19])
    todo = [layout.root]
    while todo:
        page = todo.pop()
        base = page * PAGE
        _, _, flags, lower, _ = struct.unpack_from("@NHHHH", data, base)
        ptrs = struct.unpack_from(f"@{(lower - HEADER) // 2}H", data, base + HEADER)
        (layout.branches if flags & 1 else layout.leaves).append(page)
        for ptr in ptrs:
            lo, hi, node_flags, ksize = struct.unpack_from("@HHHH", data, base + ptr)
            if flags & 1:
                todo.append(lo | hi << 16 | node_flags << 32)
            else:
                big = bool(node_flags & 1)
                layout.nodes.append((page, ptr, big))
                if big:
                    layout.overflow.append(
                        struct.unpack_from("@N", data, base + ptr + 8 + ksize)[0]
                    )
    return layout


def patch(path: Path, offset: int, new: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(new)
