"""open_db's __getitems__ (PyTorch's batched fetch): what ``[db[i] for i in indices]``
gives, for any sequence of integers, on raw and PNG records, both backends, whether the
records stack or not; an index out of range is the reader's RecordIndexError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from db_helpers import serialize, write_raw_db
from png_helpers import image_of, png_of, record

from mnist2db import DatumDataset, convert, open_db
from mnist2db.errors import RecordIndexError
from mnist2db.formats.datum.message import record_key

COUNT = 40
ORDER = [5, 0, 39, -1, 17, 5, -40, 22]


@pytest.fixture(params=["lmdb", "leveldb"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["raw", "png"])
def database(request: pytest.FixtureRequest, mnist_pair, tmp_path: Path, backend: str) -> Path:
    images, labels, _, _ = mnist_pair(COUNT, 6, 5)
    out = tmp_path / f"db_{request.param}_{backend}"
    encoded = "png" if request.param == "png" else None
    convert(images, labels, out, backend=backend, encoded=encoded)
    return out


def mixed_records() -> dict[bytes, bytes]:
    """Records of three shapes and two encodings: raw 6x5, raw 7x3, PNG 6x5, PNG 4x4."""
    values = {}
    for i in range(COUNT):
        kind = i % 4
        if kind == 0:
            values[i] = serialize(bytes(range(i, i + 30)), 6, 5, i)
        elif kind == 1:
            values[i] = serialize(bytes(range(i, i + 21)), 7, 3, i)
        elif kind == 2:
            values[i] = record(png_of(image_of(i, 6, 5), "fixed"), i, 6, 5)
        else:
            values[i] = record(png_of(image_of(i, 4, 4), "fixed"), i, 4, 4)
    return {record_key(i): value for i, value in values.items()}


def same_as_one_by_one(db: DatumDataset, indices, batch) -> None:  # type: ignore[no-untyped-def]
    expected = [db[i] for i in indices]
    assert len(batch) == len(expected)
    for (image, label), (want_image, want_label) in zip(batch, expected, strict=True):
        assert type(label) is int and label == want_label
        assert image.dtype == want_image.dtype and image.shape == want_image.shape
        assert np.array_equal(image, want_image)
        assert image.flags.writeable


@pytest.mark.parametrize(
    "kind", ["list", "tuple", "numpy int64", "numpy uint16", "numpy ints in a list", "range"]
)
def test_any_sequence_of_integers(database: Path, kind: str) -> None:
    indices = {
        "list": ORDER,
        "tuple": tuple(ORDER),
        "numpy int64": np.array(ORDER, np.int64),
        "numpy uint16": np.array([i % COUNT for i in ORDER], np.uint16),
        "numpy ints in a list": [np.int32(i) for i in ORDER],
        "range": range(3, 30, 4),
    }[kind]
    with open_db(database) as db:
        batch = db.__getitems__(indices)  # type: ignore[arg-type]
        same_as_one_by_one(db, list(indices), batch)
        # Records that stack are views of one array made for the batch.
        assert batch[0][0].base is not None and batch[0][0].base is batch[-1][0].base
        assert db.__getitems__([]) == [] and db.__getitems__(np.array([], np.int64)) == []


def test_records_of_other_shapes_come_back_as_the_list(tmp_path: Path, backend: str) -> None:
    path = write_raw_db(tmp_path / f"mixed_{backend}", backend, mixed_records())
    with open_db(path) as db:
        for indices in (list(range(COUNT)), [1, 0], np.array([3, 2, 1, 0]), [2, 6, 10]):
            same_as_one_by_one(db, list(indices), db.__getitems__(indices))  # type: ignore[arg-type]
        shapes = {image.shape for image, _ in db.__getitems__(range(8))}
        assert shapes == {(1, 6, 5), (1, 7, 3), (1, 4, 4)}
        # Records of one shape among them still stack.
        stacked = db.__getitems__([0, 4, 8])
        assert stacked[0][0].base is stacked[2][0].base is not None


def test_float_and_byte_records_do_not_stack_but_read(tmp_path: Path, backend: str) -> None:
    from mnist2db.datum_pb2 import Datum

    floats = Datum(channels=1, height=6, width=5, label=3)
    floats.float_data.extend(float(i) / 2 for i in range(30))
    records = {
        record_key(0): serialize(bytes(30), 6, 5, 1),
        record_key(1): floats.SerializeToString(),
    }
    with open_db(write_raw_db(tmp_path / f"float_{backend}", backend, records)) as db:
        batch = db.__getitems__([0, 1, 0])
        same_as_one_by_one(db, [0, 1, 0], batch)
        assert [image.dtype for image, _ in batch] == [np.uint8, np.float64, np.uint8]


@pytest.mark.parametrize("bad", [[0, COUNT], [-COUNT - 1], np.array([1, 99]), [np.int64(COUNT)]])
def test_out_of_range_is_the_readers_error(database: Path, bad) -> None:  # type: ignore[no-untyped-def]
    expected = r"index -?\d+ is out of range \(40 records\)"
    with open_db(database) as db, pytest.raises(RecordIndexError, match=expected):
        db.__getitems__(bad)


@pytest.mark.parametrize("bad", [[0, 1.0], [True], np.array([True, False]), ["1"]])
def test_indices_that_are_not_integers_are_a_type_error(database: Path, bad) -> None:  # type: ignore[no-untyped-def]
    with open_db(database) as db, pytest.raises(TypeError, match="must be integers"):
        db.__getitems__(bad)
