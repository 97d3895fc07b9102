"""open_db over PNG records: db[i], __getitems__, read_range and iteration give what the
general path (``db.get``: protobuf, then the PNG decoder) gives, record by record, error by
error, on records of either encoder mixed with hostile ones, on both backends; and the
records mnist2db writes never reach the general path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from db_helpers import write_raw_db
from os_helpers import in_forked_child
from png_helpers import hostile_records, image_of, png_of, record, same

import mnist2db
from mnist2db import convert, open_db
from mnist2db.errors import DatumError
from mnist2db.formats.datum.message import record_key
from mnist2db.formats.png.encoder import PNG_COMPRESSIONS, encode_png_batch

GOOD = 300
#: Where the hostile records go (after the first record, which sets the layout).
HOSTILE = {name: GOOD + 7 * i for i, name in enumerate(hostile_records())}


def general(db: mnist2db.DatumDataset, i: int) -> tuple[np.ndarray, int] | str:
    try:
        return db.get(record_key(i))
    except DatumError as exc:
        return str(exc)


def outcome(read, *args):  # type: ignore[no-untyped-def]
    try:
        return read(*args)
    except DatumError as exc:
        return str(exc)


@pytest.fixture(scope="module", params=["rle", "fixed", "mnist2db"])
def mixed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per backend, a database of GOOD records of one encoder, then, every 7th, the hostile
    records (good ones between them)."""
    encoder = request.param
    base = tmp_path_factory.mktemp(f"png_{encoder}")
    count = max(HOSTILE.values()) + 3
    if encoder == "mnist2db":  # convert's own (its default compression)
        images = np.stack([image_of(i) for i in range(count)])
        values = dict(enumerate(encode_png_batch(images, np.arange(count) % 128)))
    else:
        values = {i: record(png_of(image_of(i), encoder), i % 128) for i in range(count)}
    for name, i in HOSTILE.items():
        values[i] = hostile_records()[name]
    records = {record_key(i): value for i, value in values.items()}
    return {b: write_raw_db(base / b, b, records) for b in ("lmdb", "leveldb")}


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_record_reads_as_the_general_path_reads_it(mixed, backend: str) -> None:
    db = open_db(mixed[backend])
    n = len(db)
    for i in range(n):
        expected = general(db, i)
        found = outcome(db.__getitem__, i)
        if isinstance(expected, str):
            assert found == expected
        else:
            same(found, expected)
            same(db[i - n], expected)
    db.close()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_batches_read_as_the_general_path_reads_their_records(mixed, backend: str) -> None:
    db = open_db(mixed[backend])
    n = len(db)
    order = np.random.default_rng(0).permutation(GOOD).tolist()
    batch = db.__getitems__(order)
    for i, found in zip(order, batch, strict=True):
        same(found, general(db, i))
    images, labels = db.read_range(0, GOOD)
    assert images.shape == (GOOD, 1, 28, 28) and images.flags.writeable
    for i in range(GOOD):
        same((images[i], int(labels[i])), general(db, i))
    # each hostile record in a batch of good ones: read as alone (of another shape too:
    # the batch is then the list db[i] gives), or its error
    for name, i in HOSTILE.items():
        expected = general(db, i)
        found = outcome(db.__getitems__, [0, i, i - n, 5])
        if isinstance(expected, str):
            assert found == expected, name
        else:
            for j, one in zip([0, i, i, 5], found, strict=True):
                same(one, general(db, j))
    db.close()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_iteration_reads_as_the_general_path_up_to_the_first_failure(mixed, backend: str) -> None:
    db = open_db(mixed[backend])
    expected = [general(db, i) for i in range(len(db))]
    failure = next(i for i, e in enumerate(expected) if isinstance(e, str))
    found = []
    with pytest.raises(DatumError) as raised:
        for item in db.records():
            found.append(item)
    assert str(raised.value) == expected[failure]
    assert len(found) == failure
    for (index, key, image, label), one in zip(found, expected, strict=False):
        same((image, label), one)
        assert key == record_key(index)
    # from just past each failing record to the next one
    start = failure + 1
    while start < len(db):
        stop = next((i for i in range(start, len(db)) if isinstance(expected[i], str)), len(db))
        items = list(db.records(start, stop))
        assert [index for index, *_ in items] == list(range(start, stop))
        for index, _, image, label in items:
            same((image, label), expected[index])
        start = stop + 1
    db.close()


def test_the_records_mnist2db_writes_never_reach_the_general_path(
    mnist_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ipath, lpath, images, labels = mnist_pair(700, 28, 28)
    out = tmp_path / "db"
    convert(ipath, lpath, out, encoded="png")

    def refuse(*args: object) -> None:
        raise AssertionError("the general path")

    with open_db(out) as db:  # (opening reads the first record through protobuf)
        monkeypatch.setattr("mnist2db.reading.decoder.decode_datum", refuse)
        monkeypatch.setattr("mnist2db.reading.decoder.decode_png_record", refuse)
        for i in (0, 5, 699, -1):
            image, label = db[i]
            np.testing.assert_array_equal(image[0], images[i])
            assert label == labels[i]
        order = np.random.default_rng(1).permutation(700).tolist()
        batch = db.__getitems__(order)
        np.testing.assert_array_equal(np.stack([im for im, _ in batch])[:, 0], images[order])
        assert [label for _, label in batch] == labels[order].tolist()
        every, got = db.read_range()
        np.testing.assert_array_equal(every[:, 0], images)
        assert got.tolist() == labels.tolist()
        assert [label for _, label in db] == labels.tolist()
        first = db[3][0]
        first[0, 0, 0] ^= 0xFF  # writable, and the next read is a fresh array
        np.testing.assert_array_equal(db[3][0][0], images[3])


@pytest.mark.parametrize("compression", PNG_COMPRESSIONS)
def test_fashion_test_set_reads_as_the_general_path(tmp_path: Path, compression: str) -> None:
    fashion = Path("/usr/share/datasets/fashion-mnist")
    if not (fashion / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    out = tmp_path / "db"
    convert(
        fashion / "t10k-images-idx3-ubyte.gz", fashion / "t10k-labels-idx1-ubyte.gz", out,
        encoded="png", png_compression=compression,
    )  # fmt: skip
    with open_db(out) as db:
        images, labels = db.read_range()
        expected = [db.get(record_key(i)) for i in range(len(db))]
        np.testing.assert_array_equal(images, np.stack([image for image, _ in expected]))
        assert labels.tolist() == [label for _, label in expected]
        order = np.random.default_rng(2).permutation(len(db)).tolist()
        for start in range(0, len(db), 500):
            batch = db.__getitems__(order[start : start + 500])
            for i, (image, label) in zip(order[start : start + 500], batch, strict=True):
                np.testing.assert_array_equal(image, expected[i][0])
                assert label == expected[i][1]
        for i in order[:2000]:
            np.testing.assert_array_equal(db[i][0], expected[i][0])


def test_forked_child_reads_png_records_through_its_own_environment(
    mnist_pair, tmp_path: Path
) -> None:
    ipath, lpath, images, labels = mnist_pair(300, 28, 28)
    out = tmp_path / "db"
    convert(ipath, lpath, out, encoded="png")
    db = open_db(out)
    assert db[1][1] == labels[1] and len(db.__getitems__(list(range(300)))) == 300

    def child() -> str:
        ok = all(np.array_equal(db[i][0][0], images[i]) for i in range(0, 300, 7))
        batch = db.__getitems__(list(range(299, -1, -1)))
        ok = ok and [label for _, label in batch] == labels[::-1].tolist()
        return str(ok and [label for _, label in db] == labels.tolist())

    assert in_forked_child(child) == "True"
    assert db[299][1] == labels[299]
    db.close()
