"""LMDB's pages, checked before liblmdb maps them: liblmdb trusts every page it reaches.

A read-only transaction follows the main database's B-tree from the root its meta page
names (liblmdb mdb.c: mdb_page_search, mdb_cursor_sibling, mdb_node_read) and trusts what
it finds: two flipped bytes of a leaf page's flags end the process with SIGABRT
(``mdb_cursor_next``'s assertion), a branch page of one key aborts ``mdb_page_search_root``,
a node offset or size past its page, or an overflow record longer than the file, reads
outside the map (SIGSEGV, SIGBUS). It never reads the free-page database (that is for
writers), so neither does this walk.

:func:`check_pages` reads every page of the tree, level by level, through a read-only map
of the length the caller checked the file has, and checks with numpy, for the pages of a
batch at once, what liblmdb would trust: each page's number, type (branch pages above the
leaves, leaves at the depth the meta page records), bounds (``mp_lower``/``mp_upper``: a branch holds two keys or more, a leaf one),
its node offsets and each node's key and data inside the page, key sizes, node flags (no
duplicate keys; a named sub-database's record is a value), branch children and overflow extents inside the file and
each reached once (no cycles, no page in two places), and the counts the meta page records
(entries; branch, leaf and overflow pages). It touches a page only where it looks: about
a tenth of an epoch's read (docs/guarantees.md has the figures). Keys are not compared
(their order only decides what a lookup finds), and LMDB keeps no checksum of a record's
bytes: the digest in mnist2db.json is what finds a changed byte (``verify``).

The layout is C's, in the machine's byte order and word size (``pgno_t`` and ``size_t``),
as liblmdb reads it: MDB_page is ``mp_pgno``, ``mp_pad``, ``mp_flags``, ``mp_lower``,
``mp_upper`` (overflow pages: ``mp_pages`` over the last two), then ``mp_ptrs``; a node
(MDB_node) is ``mn_lo``, ``mn_hi``, ``mn_flags``, ``mn_ksize``, then the key and the data
(a branch node's child page is ``mn_lo | mn_hi << 16 | mn_flags << 32``; a leaf node's data
size is ``mn_lo | mn_hi << 16``, and with F_BIGDATA its data is the first overflow page's
number).
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mnist2db.errors import BackendError
from mnist2db.storage.databases.backends import LMDB_KEY_LIMIT

WORD = struct.calcsize("N")  # size_t and pgno_t
#: PAGEHDRSZ: the page header before ``mp_ptrs``.
PAGE_HEADER = WORD + 8
_PGNO = np.dtype(f"=u{WORD}")
_U16 = np.dtype("=u2")
_H = WORD // 2  # the header's 16-bit fields, counted in 16-bit words: flags, lower, upper
_FLAGS, _LOWER, _UPPER, _PTRS = _H + 1, _H + 2, _H + 3, _H + 4
_NODE = 8  # NODESIZE: mn_lo, mn_hi, mn_flags, mn_ksize
_HEAD_WORDS = 32  # 64 bytes: a cache line

P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
_P_DIRTY = 0x10  # set on pages in memory while written; harmless to a reader
_NOT_DIRTY = 0xFFFF ^ _P_DIRTY
F_BIGDATA, F_SUBDATA = 0x01, 0x02
_DB_RECORD = 8 + 5 * WORD  # sizeof(MDB_db)
#: CURSOR_STACK: a cursor holds at most this many pages from the root to a leaf.
MAX_DEPTH = 32
#: MDB_MAXKEYSIZE: liblmdb refuses longer keys when they are written.
MAX_KEY = LMDB_KEY_LIMIT
#: P_INVALID: the root of an empty database.
NO_PAGE = (1 << (8 * WORD)) - 1
#: The first page a tree may use (pages 0 and 1 are the meta pages).
FIRST_PAGE = 2
#: Bytes of pages checked at once (the arrays of a batch: about a fifth of that).
BATCH_BYTES = 16 << 20


@dataclass(frozen=True)
class MainDb:
    """What a meta page records of the main database (MDB_db), and of the file."""

    page_size: int
    last_page: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int


def check_pages(name: str, fd: int, db: MainDb) -> None:
    """Raise unless every page liblmdb can reach from ``db``'s root, in the LMDB data file
    ``name`` open as ``fd``, is one liblmdb can read without leaving its page or the file.

    The file holds at least ``db.last_page + 1`` pages (checked by the caller).

    Raises:
        BackendError: a page, node or overflow record is damaged, or the main database is
            not one liblmdb reads as plain keys and values (duplicate keys, integer keys).
    """
    length = (db.last_page + 1) * db.page_size
    try:
        view = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError, OverflowError) as exc:
        raise BackendError(f"{name}: cannot map its {length} bytes: {exc}") from None
    walk = _Walk(name, db)
    try:
        walk.file = np.frombuffer(view, np.uint8).reshape(db.last_page + 1, db.page_size)
        walk.windows = sliding_window_view(walk.file.view(_U16).reshape(-1), 4)
        walk.run()
    finally:
        walk.file = walk.windows = walk.file[:0].copy()  # no view of the map left
        with contextlib.suppress(BufferError):
            view.close()


class _Walk:
    def __init__(self, name: str, db: MainDb) -> None:
        self.name, self.db = name, db
        self.page_size = db.page_size
        self.seen: list[np.ndarray] = []  # the tree's pages, a sorted array per level
        self.entries = 0
        self.branch_pages = 0
        self.leaf_pages = 0
        self.overflow: list[tuple[np.ndarray, np.ndarray]] = []  # (first page, size) of records
        self.overflow_pages = 0
        self.file = np.empty((0, db.page_size), np.uint8)  # the map, while run() runs
        self.windows = self.file  # four 16-bit words from each word of the map

    def damaged(self, what: str) -> BackendError:
        return BackendError(f"{self.name}: {what}: a damaged LMDB database")

    def run(self) -> None:
        db = self.db
        if db.flags & 0x7FFF:
            raise BackendError(
                f"{self.name}: its main database has flags 0x{db.flags:x} (duplicate or "
                "integer keys): not a database of Caffe's records, or a damaged one"
            )
        if db.root == NO_PAGE:
            if db.entries or db.depth:
                raise self.damaged(
                    f"an empty main database (no root page) recording {db.entries} entries "
                    f"and depth {db.depth}"
                )
            return
        if not FIRST_PAGE <= db.root <= db.last_page:
            raise self.damaged(f"root page {db.root} outside pages 2 to {db.last_page}")
        if not 1 <= db.depth <= MAX_DEPTH:
            raise self.damaged(f"tree depth {db.depth}, expected 1 to {MAX_DEPTH}")
        level = np.array([db.root], np.uint64)
        for depth in range(1, db.depth + 1):
            self.add_seen(level, depth)
            leaves = depth == db.depth
            children = [self.check_level(batch, leaves) for batch in self.batches(level)]
            if not leaves:
                level = np.concatenate(children)
        self.check_overflow()
        self.check_counts()

    # -- reading pages ---------------------------------------------------------------------

    def batches(self, level: np.ndarray) -> list[np.ndarray]:
        """The level's page numbers in batches of at most BATCH_BYTES of pages, in file
        order (the map is read forwards)."""
        order = np.sort(level)
        step = max(1, BATCH_BYTES // self.page_size)
        return [order[i : i + step] for i in range(0, len(order), step)]

    def read(self, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An ``(m, page_size)`` array holding the pages numbered ``pages``, and the row
        of each: the file's map, whose pages the checks touch only where they look."""
        return self.file, pages.astype(np.intp)

    # -- the checks ------------------------------------------------------------------------

    def add_seen(self, level: np.ndarray, depth: int) -> None:
        """Pages reached at ``depth``: each once, in range, never reached before (a cycle,
        or a page two parents share)."""
        ordered = np.sort(level)
        out = (ordered < FIRST_PAGE) | (ordered > self.db.last_page)
        if out.any():
            page = int(ordered[np.argmax(out)])
            raise self.damaged(f"a branch page points to page {page}, outside the file's pages")
        again = ordered[1:] == ordered[:-1]
        if again.any():
            raise self.damaged(f"page {int(ordered[1:][np.argmax(again)])} is reached twice")
        for earlier in self.seen:
            hit = np.isin(ordered, earlier, assume_unique=True)
            if hit.any():
                page = int(ordered[np.argmax(hit)])
                raise self.damaged(f"page {page} is reached again at depth {depth} (a cycle)")
        self.seen.append(ordered)

    def check_level(self, pages: np.ndarray, leaves: bool) -> np.ndarray:
        """Check a batch of one level's pages; return the child pages of branch pages."""
        block, where = self.read(pages)
        size = self.page_size
        n = len(pages)
        words = block.view(_U16)
        kind, what = (P_LEAF, "leaf") if leaves else (P_BRANCH, "branch")
        # The first cache line of each page: its header and its first node offsets.
        header = words[where, :_HEAD_WORDS]
        numbers = header[:, :_H].copy().view(_PGNO)[:, 0]
        self.fail_rows(pages, numbers != pages, lambda i: f"records page number {int(numbers[i])}")
        flags = header[:, _FLAGS] & _NOT_DIRTY
        self.fail_rows(
            pages,
            flags != kind,
            lambda i: f"flags 0x{int(header[i, _FLAGS]):x}, expected a {what} page (0x{kind:x})",
        )
        lower = header[:, _LOWER].astype(np.int32)
        upper = header[:, _UPPER].astype(np.int32)
        least = 1 if leaves else 2  # mdb_page_search_root asserts a branch has two keys
        bad = (
            (lower < PAGE_HEADER + 2 * least)
            | ((lower - PAGE_HEADER) % 2 != 0)
            | (upper < lower)
            | (upper > size)
        )
        self.fail_rows(
            pages,
            bad,
            lambda i: (
                f"bounds lower {int(lower[i])} upper {int(upper[i])} in a page of {size} "
                f"bytes (a {what} page holds {least} key{'s' * (least > 1)} or more)"
            ),
        )
        counts = (lower - PAGE_HEADER) // 2
        if leaves:
            self.leaf_pages += n
            self.entries += int(counts.sum())
        else:
            self.branch_pages += n

        # Every node of the batch at once: rows[j] is the page of node j, ptrs[j] its offset.
        widest = int(counts.max())
        if _PTRS + widest <= _HEAD_WORDS:
            slots = header[:, _PTRS : _PTRS + widest]
        else:
            slots = words[where, _PTRS : _PTRS + widest]
        mask = np.arange(widest) < counts[:, None]
        ptrs = slots[mask].astype(np.int32)
        rows = np.repeat(np.arange(n), counts)
        bad = (ptrs < upper[rows]) | (ptrs > size - _NODE) | (ptrs & 1 != 0)
        self.fail_nodes(pages, rows, bad, lambda j: f"offset {int(ptrs[j])} outside its nodes")
        at = where[rows] * (size // 2) + (ptrs >> 1)
        # Each node's four 16-bit fields in one gather: a window of four words at each word.
        nodes = self.windows[at]
        lo, hi = nodes[:, 0].astype(np.int64), nodes[:, 1].astype(np.int64)
        node_flags, key_size = nodes[:, 2].astype(np.int32), nodes[:, 3].astype(np.int32)
        key_end = ptrs + _NODE + key_size
        bad = (key_size > MAX_KEY) | (key_end > size)
        self.fail_nodes(pages, rows, bad, lambda j: f"a key of {int(key_size[j])} bytes")
        if not leaves:
            children: np.ndarray = lo | (hi << 16)
            if WORD == 8:  # pgno_t's high 16 bits are mn_flags
                children |= node_flags.astype(np.int64) << 32
            return children.astype(np.uint64)

        data_size = lo | (hi << 16)
        big = node_flags == F_BIGDATA
        # A named sub-database's record in the main database: read as a 48-byte value
        # (its own tree is never opened: max_dbs=0).
        named = (node_flags == F_SUBDATA) & (data_size == _DB_RECORD)
        self.fail_nodes(
            pages,
            rows,
            (node_flags != 0) & ~big & ~named,
            lambda j: f"node flags 0x{int(node_flags[j]):x} (duplicate keys, or damaged)",
        )
        self.fail_nodes(pages, rows, key_size == 0, lambda j: "an empty key")
        inline_end = key_end + np.where(big, WORD, data_size)
        self.fail_nodes(
            pages,
            rows,
            inline_end > size,
            lambda j: f"a value of {int(data_size[j])} bytes past the end of its page",
        )
        if big.any():
            starts = (where[rows[big]] * size + key_end[big])[:, None] + np.arange(WORD)
            first = block.reshape(-1)[starts].copy().view(_PGNO)[:, 0].astype(np.uint64)
            self.overflow.append((first, data_size[big].astype(np.uint64)))
        return np.empty(0, np.uint64)

    def fail_rows(self, pages: np.ndarray, bad: np.ndarray, what) -> None:  # type: ignore[no-untyped-def]
        if bad.any():
            row = int(np.argmax(bad))
            raise self.damaged(f"page {int(pages[row])}: {what(row)}")

    def fail_nodes(self, pages: np.ndarray, rows: np.ndarray, bad: np.ndarray, what) -> None:  # type: ignore[no-untyped-def]
        if bad.any():
            j = int(np.argmax(bad))
            node = j - int(np.searchsorted(rows, rows[j]))
            raise self.damaged(f"page {int(pages[rows[j]])}: node {node}: {what(j)}")

    def check_overflow(self) -> None:
        """Each overflow record's pages inside the file, and no page in two records or in
        the tree. Their headers are not read: liblmdb reads a record's bytes from the page
        its node names, for the size its node records, never the header (a record of
        large images would cost a page read each)."""
        if not self.overflow:
            return
        first = np.concatenate([f for f, _ in self.overflow])
        sizes = np.concatenate([s for _, s in self.overflow])
        size = self.page_size
        needed = (PAGE_HEADER - 1 + sizes) // size + 1  # OVPAGES
        last = first + needed - 1
        out = (first < FIRST_PAGE) | (first > self.db.last_page) | (last > self.db.last_page)
        if out.any():
            i = int(np.argmax(out))
            raise self.damaged(
                f"an overflow record of {int(sizes[i])} bytes at page {int(first[i])} "
                f"reaches past the file's last page {self.db.last_page}"
            )
        order = np.argsort(first, kind="stable")
        first, needed, sizes = first[order], needed[order], sizes[order]
        overlap = first[1:] < first[:-1] + needed[:-1]
        if overlap.any():
            raise self.damaged(f"page {int(first[1:][np.argmax(overlap)])} is in two records")
        tree = np.concatenate(self.seen)
        hit = np.searchsorted(first, tree, side="right") - 1
        inside = (hit >= 0) & (tree < first[np.maximum(hit, 0)] + needed[np.maximum(hit, 0)])
        if inside.any():
            raise self.damaged(
                f"page {int(tree[np.argmax(inside)])} is both a tree page and a record's"
            )
        self.overflow_pages = int(needed.sum())

    def check_counts(self) -> None:
        db = self.db
        for what, walked, recorded in (
            ("entries", self.entries, db.entries),
            ("leaf pages", self.leaf_pages, db.leaf_pages),
            ("branch pages", self.branch_pages, db.branch_pages),
            ("overflow pages", self.overflow_pages, db.overflow_pages),
        ):
            if walked != recorded:
                raise self.damaged(
                    f"its meta page records {recorded} {what}, its pages hold {walked}"
                )
