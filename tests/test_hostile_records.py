"""Hostile Datum records, through every reader: each reads the record, or refuses it in one
line naming the database and the key. Never a numpy/struct/protobuf traceback, and ``info``
never says ``valid yes`` of a record that a reader refuses.

The readers: open_db (db[i], slices, iteration, __getitems__, read_range), iter_db,
info, verify, export (to IDX, to files, to WebDataset shards), mean, compute_image_mean, show's record selection, and the CLI.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_raw_db
from helpers import write_idx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mnist2db
from mnist2db.caffe_tools.drop_ins import compute_image_mean
from mnist2db.cli.app import cli
from mnist2db.errors import DatumError, Mnist2dbError
from mnist2db.exporting.to_idx import export_db
from mnist2db.formats.datum.message import encode_datum, message_type
from mnist2db.info import db_info
from mnist2db.mean import compute_mean
from mnist2db.show import select_records
from mnist2db.verify import verify_db

Datum = message_type("Datum")
INT32 = (-(2**31), 2**31 - 1)
GOOD = encode_datum(bytes(range(12)), 1, 3, 4, 5)

#: The issue's examples and their neighbours, for both backends.
NAMED = {
    "negative sides whose product is the data length": Datum(
        channels=-1, height=-1, width=4, data=b"abcd", label=1
    ),
    "two negative sides": Datum(channels=1, height=-2, width=-2, data=b"abcd", label=1),
    "an empty Datum": Datum(),
    "no channels": Datum(channels=0, height=3, width=4, data=b"", label=1),
    "past Caffe's blob limit": Datum(channels=2**31 - 1, height=2**31 - 1, width=0, label=1),
    "data shorter than the shape": Datum(channels=1, height=3, width=4, data=b"abc", label=1),
    "float_data longer than the shape": Datum(
        channels=1, height=1, width=1, float_data=[1.0, 2.0], label=1
    ),
    "encoded junk": Datum(channels=1, height=3, width=4, data=b"junk", encoded=True, label=1),
    "encoded nothing": Datum(encoded=True, label=1),
    "a PNG signature and nothing else": Datum(data=b"\x89PNG\r\n\x1a\n", encoded=True, label=1),
}


def write_db(path: Path, backend: str, values: list[bytes]) -> Path:
    return write_raw_db(path, backend, {b"%08d" % i: v for i, v in enumerate(values)})


def source_pair(work: Path) -> tuple[Path, Path]:
    images = np.arange(24, dtype=np.uint8).reshape(2, 3, 4) % 12
    return write_idx(work / "i", images), write_idx(work / "l", np.array([5, 5], np.uint8))


def readers(db: Path, work: Path) -> dict[str, Callable[[], object]]:
    images, labels = source_pair(work)

    def dataset(use: Callable[[Any], object]) -> Callable[[], object]:
        def run() -> object:
            with mnist2db.open_db(db) as opened:
                return use(opened)

        return run

    return {
        "db[i]": dataset(lambda d: [d[i] for i in range(len(d))]),
        "db[-1]": dataset(lambda d: d[-1]),
        "db[a:b]": dataset(lambda d: d[0:2]),
        "iteration": dataset(list),
        "__getitems__": dataset(lambda d: d.__getitems__(list(range(len(d))))),
        "read_range": dataset(lambda d: d.read_range(-len(d))),
        "records": dataset(lambda d: list(d.records())),
        "iter_db": lambda: list(mnist2db.iter_db(db)),
        "info": lambda: db_info(db),
        "verify": lambda: verify_db(db, images, labels),
        "export": lambda: export_db(db, work / "out", prefix="x", overwrite=True),
        "export --to files": lambda: mnist2db.export_files(db, work / "files", overwrite=True),
        "export --to webdataset": lambda: mnist2db.export_webdataset(
            db, work / "shards", overwrite=True
        ),
        "mean": lambda: compute_mean(db),
        "show": lambda: list(select_records(db, count=5)[1]),
    }


@contextlib.contextmanager
def bounded_memory(extra: int = 1 << 30) -> Iterator[None]:
    """At most ``extra`` more bytes of address space: a reader that allocates without
    bound fails here with MemoryError instead of the machine's OOM killer ending pytest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        size = int(statm.read().split()[0]) * resource.getpagesize()
    limit = size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def check_every_reader(db: Path, work: Path) -> None:
    """Every reader reads ``db`` or raises one line naming it; info agrees with open_db."""
    with bounded_memory():
        _check_every_reader(db, work)


def _check_every_reader(db: Path, work: Path) -> None:
    refused: dict[str, str] = {}
    for name, read in readers(db, work).items():
        try:
            result = read()
        except Mnist2dbError as exc:
            text = str(exc)
            assert "\n" not in text, (name, text)
            assert text.startswith(f"{db}: "), (name, text)
            refused[name] = text
            continue
        if name == "info":
            info = result
    # A refused export leaves no partial file under a final name.
    if "export --to files" in refused:
        assert not (work / "files").exists(), refused["export --to files"]
    if "export --to webdataset" in refused:
        # What a killed export leaves: whole shards its manifest lists, marked incomplete.
        left = {p.name for p in work.glob("shards*")}
        if left:
            manifest = json.loads((work / "shards.shards.json").read_text())
            assert manifest["complete"] is False
            assert left == {"shards.shards.json"} | {s["name"] for s in manifest["shards"]}
    if "db[i]" in refused:
        # A record a reader refuses is never called valid: info names the same key.
        key = refused["db[i]"].split(": ")[1]
        assert "info" in refused or info.problem is not None, refused  # type: ignore[attr-defined]
        if "info" not in refused:
            assert info.problem.startswith(key), (info.problem, refused)  # type: ignore[attr-defined]
        for name in ("iteration", "records", "read_range", "__getitems__", "mean", "show"):
            assert name in refused, (name, refused)
    # The drop-in: exit status 0 or 1, its one-line glog error naming the database.
    code = compute_image_mean([str(db)])
    assert code in (0, 1)
    # The CLI: exit 0 or 1, never a traceback; an error is one "Error: DB: ..." line.
    runner = CliRunner()
    for args in (["info", str(db)], ["mean", str(db), str(work / "m.binaryproto"), "--overwrite"]):
        result = runner.invoke(cli, args)
        assert result.exit_code in (0, 1), (args, result.output, result.exception)
        if result.exit_code == 1:
            assert result.stderr.startswith(f"Error: {db}: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_hostile_records_are_refused_in_one_line_by_every_reader(
    tmp_path: Path, backend: str, name: str
) -> None:
    bad = NAMED[name].SerializeToString()
    for values in ([bad], [GOOD, bad]):
        db = write_db(tmp_path / f"db{len(values)}_{backend}", backend, values)
        key = f"0000000{len(values) - 1}"
        with pytest.raises(DatumError) as caught, mnist2db.open_db(db) as dataset:
            dataset[len(values) - 1]
        assert str(caught.value).startswith(f"{db}: key {key}: ")
        assert str(caught.value).count(f"key {key}") == 1  # never "key X: key X: ..."
        assert db_info(db).problem.startswith(f"key {key}: ")  # type: ignore[union-attr]
        check_every_reader(db, tmp_path)


def test_info_decodes_encoded_records_and_names_the_bad_one(tmp_path: Path) -> None:
    """An encoded database whose 3rd record's PNG is broken: info said 'valid yes'."""
    images = np.arange(60, dtype=np.uint8).reshape(5, 3, 4)
    labels = np.arange(5, dtype=np.uint8)
    made = tmp_path / "png"
    mnist2db.convert(write_idx(tmp_path / "i", images), write_idx(tmp_path / "l", labels), made,
                     encoded="png")  # fmt: skip
    values = [v for _, v in mnist2db.open_reader(made)]
    datum = Datum.FromString(values[2])
    datum.data = datum.data[:-20] + bytes(20)  # IEND and the CRC of IDAT gone
    values[2] = datum.SerializeToString()
    db = write_db(tmp_path / "broken", "lmdb", values)
    info = db_info(db)
    assert info.problem is not None and info.problem.startswith("key 00000002: ")
    result = CliRunner().invoke(cli, ["info", str(db)])
    assert result.exit_code == 1 and "valid       no" in result.stdout
    check_every_reader(db, tmp_path)


def test_a_zero_sized_record_as_convert_writes_it_still_reads(tmp_path: Path) -> None:
    """Caffe's data layer takes 1 × 4 × 0 (and so does convert): read as uint8 (1, 4, 0)."""
    db = write_db(tmp_path / "db", "lmdb", [encode_datum(b"", 1, 4, 0, 3)] * 2)
    with mnist2db.open_db(db) as dataset:
        image, label = dataset[1]
        assert image.shape == (1, 4, 0) and image.dtype == np.uint8 and label == 3
        assert dataset.read_range()[0].shape == (2, 1, 4, 0)
    assert db_info(db).problem is None


def test_records_of_no_pixels_with_a_huge_side(tmp_path: Path) -> None:
    """Caffe takes 2^31-1 channels (or rows) of no pixels; the readers do too, in no
    memory, and mean refuses them (there is nothing to average) instead of allocating
    per-channel sums for 2^31-1 channels."""
    for shape in ((2**31 - 1, 1, 0), (1, 2**31 - 1, 0)):
        db = write_db(tmp_path / f"db{shape[0]}", "lmdb", [encode_datum(b"", *shape, 1)])
        with mnist2db.open_db(db) as dataset:
            assert dataset[0][0].shape == shape
        with pytest.raises(DatumError) as caught:
            compute_mean(db)
        assert str(caught.value) == f"{db}: key 00000000: Datum {shape} has no pixels to average"
        check_every_reader(db, tmp_path)


# -- the fuzz ---------------------------------------------------------------------------------

SIDES = st.one_of(
    st.sampled_from([-(2**31), -2, -1, 0, 1, 2, 3, 4, 2**31 - 1]), st.integers(*INT32)
)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.just(math.nan))


@st.composite
def hostile_values(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=48))  # bytes that may not parse at all
    datum = Datum()
    shape = [draw(SIDES) for _ in range(3)]
    for field, side in zip(("channels", "height", "width"), shape, strict=True):
        if draw(st.booleans()):
            setattr(datum, field, side)
    size = shape[0] * shape[1] * shape[2]
    pixels = draw(
        st.sampled_from(["none", "fits", "other", "png"])
        if 0 <= size <= 64
        else st.sampled_from(["none", "other", "png"])
    )
    if pixels == "fits":
        datum.data = draw(st.binary(min_size=size, max_size=size))
    elif pixels == "other":
        datum.data = draw(st.binary(max_size=70))
    elif pixels == "png":
        datum.data = b"\x89PNG\r\n\x1a\n" + draw(st.binary(max_size=60))
    if draw(st.booleans()):
        count = size if 0 <= size <= 64 and draw(st.booleans()) else draw(st.integers(0, 8))
        datum.float_data.extend(draw(st.lists(FLOATS, min_size=count, max_size=count)))
    if draw(st.booleans()):
        datum.encoded = draw(st.booleans())
    if draw(st.booleans()):
        datum.label = draw(st.integers(*INT32))
    return datum.SerializeToString()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=hostile_values(), first=st.booleans())
def test_fuzzed_datum_fields_through_every_reader(
    tmp_path: Path, value: bytes, first: bool
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        db = write_db(Path(work) / "db", "lmdb", [value] if first else [GOOD, value])
        check_every_reader(db, Path(work))
