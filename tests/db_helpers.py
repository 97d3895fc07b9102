"""Test helpers for databases: records written with the backends' own libraries, edited in
place, digested, and a small conversion to start from."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import lmdb


def record_digest(path: Path) -> tuple[int, str]:
    """Count and sha256 over, in key order, 4-byte big-endian len(key), key, len(value), value."""
    from mnist2db.storage.databases.readers import open_reader

    digest = hashlib.sha256()
    count = 0
    with open_reader(path) as reader:
        for key, value in reader:
            key, value = bytes(key), bytes(value)
            digest.update(struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value)
            count += 1
    return count, digest.hexdigest()


def serialize(data: bytes, rows: int, cols: int, label: int) -> bytes:
    """protobuf's own bytes for a one-channel Datum (what the fast encoders must equal)."""
    from mnist2db.datum_pb2 import Datum

    datum = Datum()
    datum.channels, datum.height, datum.width = 1, rows, cols
    datum.data = data
    datum.label = label
    return datum.SerializeToString()


def converted(mnist_pair, tmp_path: Path, backend: str = "lmdb", count: int = 25, **kw):
    from mnist2db import convert

    images, labels, image_array, label_array = mnist_pair(count, 6, 5, **kw)
    db = tmp_path / f"tiny_{backend}"
    convert(images, labels, db, backend=backend)
    return db, images, labels, image_array, label_array


def rewrite_lmdb(db: Path, edit) -> None:
    """Apply ``edit(txn)`` to an LMDB database with lmdb itself (no mnist2db code)."""
    env = lmdb.open(str(db), map_size=1 << 24)
    with env.begin(write=True) as txn:
        edit(txn)
    env.close()


def flip(key: bytes, offset: int):
    def edit(txn) -> None:
        value = bytearray(txn.get(key))
        value[offset] ^= 0x5A
        txn.put(key, bytes(value))

    return edit


def write_lmdb(path: Path, records: dict[bytes, bytes]) -> Path:
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for key, value in records.items():
            txn.put(key, value)
    env.close()
    return path


def write_raw_db(path: Path, backend: str, records: dict[bytes, bytes]) -> Path:
    """A database of exactly ``records``, written with the backend's own library (not mnist2db)."""
    if backend == "lmdb":
        return write_lmdb(path, records)
    import plyvel

    db = plyvel.DB(str(path), create_if_missing=True)
    for key, value in records.items():
        db.put(key, value)
    db.close()
    return path


def write_labels(path: Path, targets, backend: str = "lmdb", keys=None) -> None:
    """A label database of ``targets`` (one float_data record a row) under ``keys``
    (default Caffe's ``%08d`` keys), as ``imageset --values`` writes them."""
    from mnist2db.conversion import write_database
    from mnist2db.formats.datum.float_datum import encode_target_batch
    from mnist2db.formats.datum.message import record_keys
    from mnist2db.storage.db_staging import staged_database

    keys = list(keys if keys is not None else record_keys(0, len(targets)))
    with staged_database(path, backend) as staging:
        records = list(zip(keys, encode_target_batch(targets), strict=True))
        write_database(backend, staging, 64, [records], len(records), lambda d, t: None, keyed=True)
