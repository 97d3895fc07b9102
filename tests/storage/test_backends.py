"""backends: LMDB and LevelDB writers, told apart by their files; errors are BackendError."""

from __future__ import annotations

from pathlib import Path

import lmdb
import plyvel
import pytest

from mnist2db.errors import BackendError, Mnist2dbError
from mnist2db.storage.databases.backends import (
    BACKENDS,
    DEFAULT_BACKEND,
    check_backend,
    check_batch_size,
    detect_backend,
    is_database_file,
    open_writer,
    size_hint,
)


def test_lmdb_map_grows_when_full(tmp_path: Path) -> None:
    writer = open_writer("lmdb", str(tmp_path), size_hint=0)
    start = writer.map_size  # type: ignore[attr-defined]
    value = b"v" * 3000
    for batch in range(30):
        writer.write_batch([(b"%08d" % (batch * 1000 + i), value) for i in range(1000)])
    writer.close()
    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    assert env.stat()["entries"] == 30000
    assert env.info()["map_size"] > start
    env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_writer_then_detect(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "db"
    path.mkdir()
    writer = open_writer(backend, str(path), size_hint=100)
    writer.write_batch([(b"%08d" % i, b"value %d" % i) for i in range(5)])
    writer.write_batch([(b"00000005", b"last")])
    writer.close()
    assert detect_backend(path) == backend
    if backend == "lmdb":
        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            assert list(txn.cursor())[-1] == (b"00000005", b"last")
            assert txn.stat()["entries"] == 6
        env.close()
    else:
        db = plyvel.DB(str(path))
        assert db.get(b"00000002") == b"value 2"
        assert len(list(db.iterator())) == 6
        db.close()
    assert all(is_database_file(backend, p.name) for p in path.iterdir())


def test_detect_backend_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "absent": "no such database",
        tmp_path / "file": "not a database directory (LMDB or LevelDB)",
        tmp_path / "empty": "neither an LMDB (no data.mdb) nor a LevelDB (no CURRENT) database",
    }
    for path, message in cases.items():
        with pytest.raises(BackendError) as caught:
            detect_backend(path)
        assert str(caught.value) == f"{path}: {message}"


def test_unknown_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackendError) as caught:
        open_writer("rocksdb", str(tmp_path))
    assert str(caught.value) == "unknown backend 'rocksdb': expected one of lmdb, leveldb"


@pytest.mark.parametrize(
    ("backend", "name", "owned"),
    [
        ("lmdb", "data.mdb", True),
        ("lmdb", "lock.mdb", True),
        ("lmdb", "notes.mdb", False),
        ("leveldb", "000005.ldb", True),
        ("leveldb", "MANIFEST-000002", True),
        ("leveldb", "notes.log", False),
        ("leveldb", "CURRENT.bak", False),
    ],
)
def test_database_files_are_only_what_the_backend_makes(
    backend: str, name: str, owned: bool
) -> None:
    assert is_database_file(backend, name) is owned


def test_the_default_backend_is_lmdb_and_unknown_ones_are_refused() -> None:
    assert DEFAULT_BACKEND == BACKENDS[0] == "lmdb"  # Caffe's convert_mnist_data default
    for backend in BACKENDS:
        check_backend(backend)
    with pytest.raises(BackendError) as info:
        check_backend("rocksdb")
    assert str(info.value) == "unknown backend 'rocksdb': expected one of lmdb, leveldb"
    with pytest.raises(BackendError, match="unknown backend 'LMDB'"):
        open_writer("LMDB", "unused")
    check_batch_size(1)
    with pytest.raises(Mnist2dbError) as info:
        check_batch_size(0)
    assert str(info.value) == "batch size must be at least 1, got 0"


def test_size_hint_counts_lmdb_pages() -> None:
    # A 28 x 28 MNIST Datum (797 bytes) packs into pages: key, value and node header.
    assert size_hint(60000, 797) == 2 * 60000 * (797 + 8 + 16) + (16 << 20)
    # A record over half a page takes whole overflow pages.
    assert size_hint(10, 3000) == 2 * 10 * 4096 + (16 << 20)
    assert size_hint(10, 5000) == 2 * 10 * 8192 + (16 << 20)
    assert size_hint(0, 797) == 16 << 20
    # A pipe's header only promises its count: at most 1 GiB is reserved for it.
    assert size_hint(10**8, 797) > 1 << 30
    assert size_hint(10**8, 797, streaming=True) == 1 << 30
    assert size_hint(10, 797, streaming=True) == size_hint(10, 797)
