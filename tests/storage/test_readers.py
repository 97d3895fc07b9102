"""The readers beyond MNIST's fixed layout, their errors, and any path bytes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import plyvel
import pytest
from db_helpers import write_raw_db
from os_helpers import in_forked_child
from PIL import Image

import mnist2db
from mnist2db import BackendError, DatumError, convert, open_db
from mnist2db.exporting.to_idx import export_db
from mnist2db.formats.datum.message import message_type
from mnist2db.info import db_info
from mnist2db.show import select_records
from mnist2db.verify import verify_db


def write_db(path: Path, backend: str, values: list[bytes]) -> None:
    write_raw_db(path, backend, {b"%08d" % i: value for i, value in enumerate(values)})


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_records_outside_the_fixed_layout(tmp_path: Path, backend: str) -> None:
    """The first record sets the fast layout; every other kind of record is read right:
    labels >= 128 and negative, another shape, float data, encoded grey and colour images."""
    Datum = message_type("Datum")
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    colour = np.arange(3 * 4 * 3, dtype=np.uint8).reshape(3, 4, 3)  # h, w, RGB
    base = np.arange(12, dtype=np.uint8).reshape(1, 3, 4)
    values = [
        mnist2db.encode_datum(base.tobytes(), 1, 3, 4, 5),
        mnist2db.encode_datum((base + 1).tobytes(), 1, 3, 4, 200),
        mnist2db.encode_datum((base + 2).tobytes(), 1, 3, 4, -3),
        mnist2db.encode_datum(bytes(range(6)), 1, 2, 3, 7),
        mnist2db.array_to_datum(np.full((1, 3, 4), 0.25, np.float32), 1).SerializeToString(),
        Datum(channels=1, height=3, width=4, data=png(grey), encoded=True, label=2).SerializeToString(),
        Datum(channels=3, height=3, width=4, data=png(colour), encoded=True, label=9).SerializeToString(),
        mnist2db.encode_datum((base + 3).tobytes(), 1, 3, 4, 127),
    ]  # fmt: skip
    path = tmp_path / "mixed"
    write_db(path, backend, values)
    with open_db(path) as db:
        expected = [
            (base, 5), (base + 1, 200), (base + 2, -3),
            (np.arange(6, dtype=np.uint8).reshape(1, 2, 3), 7),
            (np.full((1, 3, 4), 0.25), 1), (grey[np.newaxis], 2),
            (colour[:, :, ::-1].transpose(2, 0, 1), 9),  # BGR, as Caffe's data layer
            (base + 3, 127),
        ]  # fmt: skip
        for i, (image, label) in enumerate(expected):
            got_image, got_label = db[i]
            assert got_label == label and type(got_label) is int
            assert got_image.dtype == image.dtype and np.array_equal(got_image, image), i
            assert got_image.flags.writeable
        assert [label for _, label in db.__getitems__([2, 1, 0, 7])] == [-3, 200, 5, 127]
        batch = db.__getitems__(list(range(len(expected))))  # not one shape: db[i]'s list
        for (image, label), (got_image, got_label) in zip(expected, batch, strict=True):
            assert got_label == label and np.array_equal(got_image, image)
        assert [label for _, label in db] == [label for _, label in expected]
        images, labels = db.read_range(0, 3)
        assert images.shape == (3, 1, 3, 4) and labels.tolist() == [5, 200, -3]
        with pytest.raises(DatumError, match=r"key 00000003: uint8 \(1, 2, 3\) does not stack"):
            db.read_range(0, 4)


def test_undecodable_encoded_image_is_one_error(tmp_path: Path) -> None:
    Datum = message_type("Datum")
    path = tmp_path / "bad_lmdb"
    write_db(path, "lmdb", [Datum(channels=1, height=1, width=1, data=b"junk", encoded=True).SerializeToString()])  # fmt: skip
    with (
        open_db(path) as db,
        pytest.raises(DatumError, match=f"^{path}: key 00000000: encoded image cannot be decoded"),
    ):
        db[0]


def test_closed_reader_and_unknown_backend(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(3, 2, 2)
    convert(ipath, lpath, tmp_path / "db", backend="lmdb")
    reader = mnist2db.open_reader(tmp_path / "db")
    reader.close()
    with pytest.raises(BackendError, match="the reader is closed"):
        reader.get(b"00000000")
    with pytest.raises(BackendError, match="unknown backend 'sqlite'"):
        mnist2db.open_reader(tmp_path / "db", "sqlite")


def test_lmdb_reader_writes_nothing(mnist_pair, tmp_path: Path) -> None:
    """lock=False: reading leaves every file as it was (read-only media work alike)."""
    ipath, lpath, _, _ = mnist_pair(30, 3, 3)
    path = tmp_path / "db"
    convert(ipath, lpath, path, backend="lmdb")
    before = {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in path.iterdir()
    }
    with open_db(path) as db:
        assert sum(1 for _ in db) == 30 and db[29][1] == db.read_range(29)[1][0]
    after = {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in path.iterdir()
    }
    assert after == before


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_reader_opens_a_non_utf8_path(mnist_pair, tmp_path: Path, backend: str) -> None:
    """info, show, verify, export, iter_db and open_db on a database named b'out\\xe9_db'."""
    ipath, lpath, images, labels = mnist_pair(12, 4, 3)
    made = tmp_path / "made"
    convert(ipath, lpath, made, backend=backend)
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xe9_db")
    os.rename(made, odd)
    with open_db(odd) as held:  # and all of them while a dataset holds it open
        assert held[11][1] == int(labels[11])
        info = db_info(odd)
        assert (info.count, info.backend, info.shape) == (12, backend, (1, 4, 3))
        total, records = select_records(odd, offset=2, count=3)
        assert total == 12 and [r.label for r in records] == [int(x) for x in labels[2:5]]
        assert verify_db(odd, ipath, lpath).count == 12
        result = export_db(odd, tmp_path / "exported", prefix="x")
        assert Path(result.images).read_bytes() == Path(ipath).read_bytes()
        assert [d.label for _, d in mnist2db.iter_db(odd)] == [int(x) for x in labels]
    assert np.array_equal(open_db(odd)[3][0][0], images[3])


def test_forked_child_reopening_leveldb_gets_the_same_advice(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, labels = mnist_pair(5, 2, 2)
    path = tmp_path / "db_leveldb"
    convert(ipath, lpath, path, backend="leveldb")
    db = open_db(path)
    assert db[1][1] == int(labels[1])

    def child() -> str:
        messages = []
        for attempt in range(2):
            try:
                (open_db(path) if attempt else db)[0]
            except BackendError as exc:
                messages.append(str(exc))
            db.close()
        return "\n".join(messages)

    messages = in_forked_child(child).split("\n")
    assert len(messages) == 2 and messages[0] == messages[1]
    assert messages[0].startswith(
        f"{path}: this LevelDB database was opened by process {os.getpid()}"
    )
    assert db[4][1] == int(labels[4])  # the parent's handle is untouched
    db.close()


def test_forked_child_reads_lmdb_through_its_own_environment(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, labels = mnist_pair(5, 2, 2)
    path = tmp_path / "db_lmdb"
    convert(ipath, lpath, path, backend="lmdb")
    db = open_db(path)
    assert db[1][1] == int(labels[1])
    got = in_forked_child(lambda: " ".join(str(db[i][1]) for i in range(5)))
    assert got == " ".join(str(int(x)) for x in labels)
    assert db[4][1] == int(labels[4])
    db.close()


def test_a_database_replaced_under_the_same_name_is_read_anew(mnist_pair, tmp_path: Path) -> None:
    """convert --overwrite while a dataset is open: a new open_db reads the new records, the
    open one keeps reading the database it opened."""
    first_i, first_l, _, first_labels = mnist_pair(6, 2, 2)
    path = tmp_path / "db"
    convert(first_i, first_l, path, backend="lmdb")
    old = open_db(path)
    assert old[5][1] == int(first_labels[5])
    other = tmp_path / "other"
    other.mkdir()
    images2 = np.full((9, 2, 2), 7, np.uint8)
    labels2 = np.arange(9, dtype=np.uint8)
    from helpers import write_idx

    convert(write_idx(other / "i", images2), write_idx(other / "l", labels2), path, backend="lmdb", overwrite=True)  # fmt: skip
    with open_db(path) as new:
        assert len(new) == 9 and new[8][1] == 8 and np.array_equal(new[0][0][0], images2[0])
    assert len(old) == 6 and old[5][1] == int(first_labels[5])
    old.close()


# -- a damaged LevelDB table is an error, never data ---------------------------------------


def _damaged_leveldb(path: Path, records: int = 5) -> Path:
    """A LevelDB without compression (nothing but the block checksum to notice damage) whose
    first record's pixels have one byte changed in its table file."""
    from mnist2db.datum_pb2 import Datum

    db = plyvel.DB(str(path), create_if_missing=True, compression=None)
    for i in range(records):
        datum = Datum(channels=1, height=4, width=4, data=bytes([7]) * 16, label=i)
        db.put(b"%08d" % i, datum.SerializeToString())
    db.compact_range()
    db.close()
    (table,) = path.glob("*.ldb")
    data = bytearray(table.read_bytes())
    data[data.index(bytes([7]) * 16) + 3] = 9
    table.write_bytes(bytes(data))
    return path


def test_a_damaged_leveldb_block_is_an_error_not_data(tmp_path: Path) -> None:
    path = _damaged_leveldb(tmp_path / "damaged")
    message = f"{path}: leveldb read failed: Corruption: block checksum mismatch"
    with pytest.raises(BackendError) as caught:
        list(mnist2db.iter_db(path))
    assert str(caught.value) == message
    with pytest.raises(BackendError) as caught:
        db_info(path)
    assert str(caught.value) == message
    with pytest.raises(BackendError) as caught, open_db(path) as dataset:
        dataset[0]
    assert str(caught.value) == message


def test_a_healthy_leveldb_read_from_any_start_is_not_called_damaged(
    mnist_pair, tmp_path: Path
) -> None:
    from mnist2db.storage.databases.readers import open_reader

    images, labels, _, _ = mnist_pair(6, 2, 2)
    convert(images, labels, tmp_path / "db", backend="leveldb")
    with open_reader(tmp_path / "db") as reader:
        assert [k for k, _ in reader.iter_from(b"00000004")] == [b"00000004", b"00000005"]
        assert list(reader.iter_from(b"00000009")) == []
        assert list(reader.iter_from(b"0")) == list(reader)
        assert len(list(reader)) == 6
        assert reader.first_key() == b"00000000"
        assert reader.last_key() == b"00000005"


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_iter_views_gives_the_records_of_iter_without_copying_lmdb_values(
    tmp_path: Path, backend: str
) -> None:
    values = [bytes([i]) * (100 + 4096 * i) for i in range(5)]
    write_db(tmp_path / "db", backend, values)
    with mnist2db.open_reader(tmp_path / "db") as reader:
        views = list(reader.iter_views())
        assert [(key, bytes(value)) for key, value in views] == list(reader)
        assert [bytes(value) for _, value in reader.iter_views(b"00000003")] == values[3:]
        kinds = {type(value) for _, value in views}
        assert kinds == ({memoryview} if backend == "lmdb" else {bytes})
        assert all(type(key) is bytes for key, _ in views)
        if backend == "lmdb":
            assert all(value.readonly for _, value in views)
