"""An LMDB database damaged past its meta pages is refused in one line by every reader,
before liblmdb reads a page (storage/databases/lmdb_pages.py): liblmdb trusts its pages, and each
case below ended a reader with SIGABRT, SIGSEGV or SIGBUS, or read outside a page. Every
reader runs in a child process, so a crash fails the test, not the suite."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from lmdb_helpers import HEADER, MAIN_AT, MAIN_FIELDS, PAGE, Layout, patch, read_layout
from os_helpers import in_forked_child

from mnist2db import convert, open_db

Edit = Callable[[bytes, Layout], list[tuple[int, bytes]]]


def u16(value: int) -> bytes:
    return struct.pack("@H", value)


def u64(value: int) -> bytes:
    return struct.pack("@Q", value)


def leaf_node(layout: Layout, big: bool = False) -> tuple[int, int]:
    page, ptr, _ = next(node for node in layout.nodes if node[2] == big)
    return page * PAGE, ptr


def main_field(layout: Layout, name: str, value: bytes) -> list[tuple[int, bytes]]:
    return [(layout.meta * PAGE + MAIN_AT + MAIN_FIELDS[name], value)]


def _leaf_flags(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    # Two bytes: the flags of the second leaf (P_LEAF, 0x02) as a branch page's (0x01).
    return [(layout.leaves[-2] * PAGE + 10, u16(0x0001))]


def _overflow_size(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base, ptr = leaf_node(layout, big=True)
    return [(base + ptr, struct.pack("@HH", 0xFFF0, 0x7FFF))]  # 2 GiB from a 2-page record


def _branch_of_one_key(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return [(layout.root * PAGE + 12, u16(HEADER + 2))]


def _offset_past_the_page(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return [(layout.leaves[0] * PAGE + HEADER, u16(PAGE - 2))]


def _key_size(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base, ptr = leaf_node(layout)
    return [(base + ptr + 6, u16(3000))]


def _value_size(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base, ptr = leaf_node(layout)
    return [(base + ptr, struct.pack("@HH", 5000, 0))]


def _duplicate_keys_flag(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base, ptr = leaf_node(layout)
    return [(base + ptr + 4, u16(0x04))]  # F_DUPDATA: liblmdb reads a sub-page


def _child_past_the_file(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base = layout.root * PAGE
    (ptr,) = struct.unpack_from("@H", data, base + HEADER + 2)
    return [(base + ptr, struct.pack("@HH", layout.last_page + 10, 0))]


def _child_is_the_root(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base = layout.root * PAGE
    (ptr,) = struct.unpack_from("@H", data, base + HEADER + 2)
    return [(base + ptr, struct.pack("@HH", layout.root, 0))]


def _overflow_past_the_file(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    base, ptr = leaf_node(layout, big=True)
    (ksize,) = struct.unpack_from("@H", data, base + ptr + 6)
    return [(base + ptr + 8 + ksize, u64(layout.last_page))]


def _root_is_a_meta_page(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return main_field(layout, "root", u64(1))


def _depth(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return main_field(layout, "depth", u16(1))


def _entries(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return main_field(layout, "entries", u64(123456))


def _dupsort(data: bytes, layout: Layout) -> list[tuple[int, bytes]]:
    return main_field(layout, "flags", u16(0x04))


# name: (database, edit, what the one line says after "data.mdb: ")
CASES: dict[str, tuple[str, Edit, str]] = {
    "leaf-flags": ("raw", _leaf_flags, "flags 0x1, expected a leaf page (0x2)"),
    "overflow-size": ("big", _overflow_size, "reaches past the file's last page"),
    "branch-of-one-key": ("raw", _branch_of_one_key, "a branch page holds 2 keys or more"),
    "offset-past-the-page": ("raw", _offset_past_the_page, "node 0: offset 4094 outside its nodes"),
    "key-size": ("raw", _key_size, "a key of 3000 bytes"),
    "value-size": ("raw", _value_size, "a value of 5000 bytes past the end of its page"),
    "duplicate-keys-flag": (
        "raw",
        _duplicate_keys_flag,
        "node flags 0x4 (duplicate keys, or damaged)",
    ),
    "child-past-the-file": ("raw", _child_past_the_file, "outside the file's pages"),
    "child-is-the-root": ("raw", _child_is_the_root, "(a cycle)"),
    "overflow-past-the-file": ("big", _overflow_past_the_file, "reaches past the file's last page"),
    "root-is-a-meta-page": ("raw", _root_is_a_meta_page, "root page 1 outside pages 2 to"),
    "depth": ("raw", _depth, "expected a leaf page"),
    "entries": ("raw", _entries, "its meta page records 123456 entries, its pages hold 2000"),
    "duplicate-keys-database": ("raw", _dupsort, "its main database has flags 0x4"),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two databases: 2000 records of 6 x 5 (a branch root over 29 leaves), and 20 of
    64 x 64 (each value on two overflow pages)."""
    from helpers import make_images, make_labels, write_idx

    base = tmp_path_factory.mktemp("lmdb_sources")
    made = {}
    for name, (count, rows, cols) in {"raw": (2000, 6, 5), "big": (20, 64, 64)}.items():
        images = write_idx(base / f"{name}-images-idx3-ubyte", make_images(count, rows, cols))
        labels = write_idx(base / f"{name}-labels-idx1-ubyte", make_labels(count))
        convert(images, labels, base / name)
        made[name] = base / name
    return made


def damaged(sources: dict[str, Path], tmp_path: Path, case: str) -> tuple[Path, str]:
    source, edit, said = CASES[case]
    db = tmp_path / "db"
    db.mkdir()
    data = (sources[source] / "data.mdb").read_bytes()
    layout = read_layout(data)
    assert len(layout.branches) >= (1 if source == "raw" else 0)
    (db / "data.mdb").write_bytes(data)
    for offset, new in edit(data, layout):
        patch(db / "data.mdb", offset, new)
    return db, said


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mnist2db", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_page_is_refused_in_one_line(sources, tmp_path: Path, case: str) -> None:
    db, said = damaged(sources, tmp_path, case)
    before = (db / "data.mdb").read_bytes()
    result = cli("info", db)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    line = result.stderr
    assert line.startswith(f"Error: {db / 'data.mdb'}: ") and line.count("\n") == 1, line
    assert said in line, line
    assert line.endswith(": a damaged LMDB database\n") or "flags 0x4" in line, line
    assert "valid" not in result.stdout

    def read() -> str:
        try:
            with open_db(db) as dataset:
                return f"read {len(list(dataset))}"
        except Exception as exc:  # noqa: BLE001 - the child reports what it raised
            return f"{type(exc).__name__}: {exc}"

    assert in_forked_child(read) == f"BackendError: {line[len('Error: ') : -1]}"
    assert (db / "data.mdb").read_bytes() == before
    assert os.listdir(db) == ["data.mdb"]


@pytest.mark.parametrize("case", ["leaf-flags", "overflow-size"])
def test_every_reader_refuses_the_cases_that_crashed(sources, tmp_path: Path, case: str) -> None:
    db, said = damaged(sources, tmp_path, case)
    images, labels = tmp_path / "images", tmp_path / "labels"
    for args in (
        ["info", db],
        ["show", db],
        ["verify", db, images, labels],
        ["export", db, tmp_path / "out"],
        ["mean", db, tmp_path / "mean.binaryproto"],
    ):
        result = cli(*args)
        assert result.returncode == 1, (args, result.returncode, result.stderr[-2000:])
        assert result.stderr.count("\n") == 1 and said in result.stderr, (args, result.stderr)
    drop_in = subprocess.run(
        [sys.executable, "-c", "import sys; from mnist2db.caffe_tools.drop_ins import "
         "compute_image_mean; sys.exit(compute_image_mean(sys.argv[1:]))", str(db),
         str(tmp_path / "mean.binaryproto")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert drop_in.returncode == 1 and said in drop_in.stderr, drop_in
    assert not (tmp_path / "out").exists() and not (tmp_path / "mean.binaryproto").exists()


def test_the_databases_mnist2db_and_lmdb_write_pass(sources) -> None:
    for path in sources.values():
        with open_db(path) as dataset:
            assert len(list(dataset)) == len(dataset) > 0


def test_an_overflow_page_header_is_never_read(sources, tmp_path: Path) -> None:
    """liblmdb reads a record's bytes where its node says, never the overflow page's
    header: damage there changes no record (and the check does not read those pages)."""
    db = tmp_path / "db"
    db.mkdir()
    data = (sources["big"] / "data.mdb").read_bytes()
    layout = read_layout(data)
    (db / "data.mdb").write_bytes(data)
    for first in layout.overflow:
        patch(db / "data.mdb", first * PAGE, bytes(HEADER))  # number, flags, page count: 0
    with open_db(sources["big"]) as good, open_db(db) as damaged_one:
        assert all(
            (a == b).all() and la == lb for (a, la), (b, lb) in zip(good, damaged_one, strict=True)
        )
