"""Conversion options: transpose, QMNIST idx2-int labels, .xz inputs,
ranges and seeded shuffles, and the metadata file that records them."""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import idx_bytes, make_images, write_idx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from os_helpers import mounted_tmpfs

import mnist2db
from mnist2db.errors import IdxFormatError, Mnist2dbError, OutputExistsError
from mnist2db.formats.datum.message import decode_datum
from mnist2db.recipe import read_metadata
from mnist2db.selection import permutation
from mnist2db.storage.databases.backends import METADATA_NAME
from mnist2db.storage.databases.readers import open_reader

Pair = Callable[..., tuple[Path, Path, np.ndarray, np.ndarray]]


def records(db: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(str(db)) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


def decoded(db: Path) -> list[tuple[bytes, np.ndarray, int]]:
    out = []
    for key, value in records(db):
        datum = decode_datum(value)
        image = np.frombuffer(datum.data, dtype=np.uint8).reshape(datum.height, datum.width)
        assert datum.channels == 1
        out.append((key, image, int(datum.label)))
    return out


def qmnist_labels(count: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 100_000, size=(count, 8), dtype=np.int32)
    rows[:, 0] = rng.integers(0, 10, size=count)
    rows[:, 7] = 0
    return rows


# -- orientation -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_transpose_swaps_height_and_width_element_by_element(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    images_path, labels_path, images, labels = mnist_pair(5, rows=3, cols=7)
    db = tmp_path / "t_db"
    result = mnist2db.convert(images_path, labels_path, db, backend, transpose=True)
    assert (result.rows, result.cols, result.transposed) == (7, 3, True)
    got = decoded(db)
    assert [k for k, _, _ in got] == [b"%08d" % i for i in range(5)]
    for i, (_, image, label) in enumerate(got):
        assert image.shape == (7, 3)
        for r in range(3):
            for c in range(7):
                assert image[c, r] == images[i, r, c]
        assert label == labels[i]
    meta = read_metadata(db)
    assert meta is not None and meta[0].transpose is True


def test_plain_convert_records_the_digest_alone(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(3)
    mnist2db.convert(images_path, labels_path, tmp_path / "db")
    assert sorted(os.listdir(tmp_path / "db")) == ["data.mdb", "lock.mdb", METADATA_NAME]
    assert set(json.loads((tmp_path / "db" / METADATA_NAME).read_text())) == {
        "format", "version", "digest"
    }  # fmt: skip
    assert read_metadata(tmp_path / "db") is None  # no options recorded


# -- QMNIST labels and .xz -------------------------------------------------------------------


@pytest.mark.parametrize("column", [0, 2, 6])
def test_idx2_int_labels_take_the_chosen_column(tmp_path: Path, column: int) -> None:
    images = make_images(6, 4, 4)
    rows = qmnist_labels(6)
    write_idx(tmp_path / "i", images)
    write_idx(tmp_path / "l", rows)
    db = tmp_path / "db"
    mnist2db.convert(tmp_path / "i", tmp_path / "l", db, "leveldb", label_column=column)
    got = decoded(db)
    assert [label for _, _, label in got] == rows[:, column].tolist()
    assert all((image == images[i]).all() for i, (_, image, _) in enumerate(got))
    meta = read_metadata(db)
    assert meta is not None
    assert meta[0].label_column == column
    assert meta[1]["source"]["label_magic"] == "0x00000c02"


def test_label_column_out_of_range_is_one_line(tmp_path: Path) -> None:
    write_idx(tmp_path / "i", make_images(2, 4, 4))
    write_idx(tmp_path / "l", qmnist_labels(2))
    with pytest.raises(IdxFormatError) as info:
        mnist2db.convert(tmp_path / "i", tmp_path / "l", tmp_path / "db", label_column=8)
    assert str(info.value) == (
        f"{tmp_path / 'l'}: label column 8 does not exist: the file has 8 columns (0 … 7)"
    )
    assert not (tmp_path / "db").exists()


def test_label_column_of_a_uint8_label_file_is_refused(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(2)
    with pytest.raises(IdxFormatError, match="label column 1 needs an idx2-int label file"):
        mnist2db.convert(images_path, labels_path, tmp_path / "db", label_column=1)


def test_xz_inputs_are_detected_by_content(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(7, rows=5, cols=6)
    plain = tmp_path / "plain_db"
    mnist2db.convert(images_path, labels_path, plain)
    xz_images = tmp_path / "images-no-suffix"
    xz_images.write_bytes(lzma.compress(images_path.read_bytes()))
    xz_labels = tmp_path / "labels.xz"
    xz_labels.write_bytes(lzma.compress(labels_path.read_bytes()))
    packed = tmp_path / "xz_db"
    mnist2db.convert(xz_images, xz_labels, packed)
    assert records(packed) == records(plain)
    assert mnist2db.read_header(xz_images).xz is True


def test_truncated_and_long_xz_are_refused(tmp_path: Path) -> None:
    data = idx_bytes(make_images(4, 4, 4))
    short = tmp_path / "short"
    short.write_bytes(lzma.compress(data[:-5]))
    with pytest.raises(IdxFormatError, match=r"truncated: header declares 64 bytes.* holds 59"):
        mnist2db.read_header(short)
    bomb = tmp_path / "bomb"
    bomb.write_bytes(lzma.compress(data + bytes(5 << 20)))
    with pytest.raises(IdxFormatError, match=r"trailing bytes: .* holds at least"):
        mnist2db.read_header(bomb)
    corrupt = tmp_path / "corrupt"
    packed = bytearray(lzma.compress(data))
    packed[len(packed) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(packed))
    with pytest.raises(IdxFormatError, match="corrupt xz stream"):
        mnist2db.read_idx(corrupt)


# -- ranges ----------------------------------------------------------------------------------


def test_offset_and_count_select_source_items_under_keys_from_zero(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    images_path, labels_path, images, labels = mnist_pair(2500, rows=2, cols=3)
    db = tmp_path / "db"
    result = mnist2db.convert(images_path, labels_path, db, offset=997, count=1100)
    assert result.count == 1100
    got = decoded(db)
    assert [k for k, _, _ in got] == [b"%08d" % i for i in range(1100)]
    for i, (_, image, label) in enumerate(got):
        assert (image == images[997 + i]).all() and label == labels[997 + i]


@pytest.mark.parametrize(
    ("offset", "count", "wanted"), [(3, 8, "items 3 … 10 do"), (11, None, "offset 11 does")]
)
def test_range_that_does_not_fit_is_one_line(
    tmp_path: Path, mnist_pair: Pair, offset: int, count: int | None, wanted: str
) -> None:
    images_path, labels_path, _, _ = mnist_pair(10)
    with pytest.raises(IdxFormatError) as info:
        mnist2db.convert(images_path, labels_path, tmp_path / "db", offset=offset, count=count)
    assert str(info.value) == f"{images_path}: {wanted} not fit: it holds 10 items (0 … 9)"
    assert not (tmp_path / "db").exists()


# -- shuffles --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_same_seed_gives_identical_records_in_the_permuted_order(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    images_path, labels_path, images, labels = mnist_pair(2100, rows=3, cols=2)
    first, second = tmp_path / "a", tmp_path / "b"
    r1 = mnist2db.convert(
        images_path, labels_path, first, backend, shuffle=True, seed=42, batch_size=256
    )
    mnist2db.convert(images_path, labels_path, second, backend, shuffle=True, seed=42)
    assert r1.seed == 42
    one, two = records(first), records(second)
    assert one == two  # every key and value
    order = permutation(42, 2100)
    assert sorted(order.tolist()) == list(range(2100))
    assert order.tolist() != list(range(2100))
    for k, (key, image, label) in enumerate(decoded(first)):
        assert key == b"%08d" % k
        assert (image == images[order[k]]).all() and label == labels[order[k]]
    third = tmp_path / "c"
    mnist2db.convert(images_path, labels_path, third, backend, shuffle=True, seed=43)
    assert records(third) != one


def test_no_seed_draws_a_fresh_one_and_reports_it(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(50)
    a = mnist2db.convert(images_path, labels_path, tmp_path / "a", shuffle=True)
    b = mnist2db.convert(images_path, labels_path, tmp_path / "b", shuffle=True)
    assert a.seed is not None and b.seed is not None and a.seed != b.seed
    # the one phrasing of a drawn seed (records.seed_note), shared by every front end
    assert f"Shuffled with seed {a.seed} (--seed {a.seed} repeats it)." in a.summary()
    again = mnist2db.convert(images_path, labels_path, tmp_path / "c", shuffle=True, seed=a.seed)
    assert records(tmp_path / "c") == records(tmp_path / "a") and again.seed == a.seed
    meta = read_metadata(tmp_path / "a")
    assert meta is not None and meta[0].seed == a.seed


def test_seed_without_shuffle_is_refused(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(2)
    with pytest.raises(Mnist2dbError, match="a seed orders a shuffle"):
        mnist2db.convert(images_path, labels_path, tmp_path / "db", seed=1)


def test_shuffled_subset_of_transposed_qmnist(tmp_path: Path) -> None:
    images = make_images(30, 2, 5)
    rows = qmnist_labels(30)
    write_idx(tmp_path / "i", images)
    write_idx(tmp_path / "l", rows, gz=True)
    db = tmp_path / "db"
    mnist2db.convert(
        tmp_path / "i", tmp_path / "l", db, transpose=True, label_column=3,
        shuffle=True, seed=5, offset=4, count=20, batch_size=7,
    )  # fmt: skip
    order = permutation(5, 20)
    got = decoded(db)
    assert len(got) == 20
    for k, (_, image, label) in enumerate(got):
        item = 4 + int(order[k])
        assert (image == images[item].T).all() and label == rows[item, 3]


# -- the metadata file and --overwrite ----------------------------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_overwrite_replaces_a_database_holding_the_metadata_file(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    images_path, labels_path, _, _ = mnist_pair(4)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, backend, shuffle=True, seed=1)
    assert METADATA_NAME in os.listdir(db)
    mnist2db.convert(images_path, labels_path, db, backend, overwrite=True)
    assert "shuffle" not in json.loads((db / METADATA_NAME).read_text())  # the digest alone
    (db / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="notes.txt"):
        mnist2db.convert(images_path, labels_path, db, backend, overwrite=True, shuffle=True)
    assert (db / "notes.txt").read_text() == "mine"


def test_metadata_file_is_not_a_record_for_either_backend(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(3)
    for backend in ("lmdb", "leveldb"):
        db = tmp_path / backend
        mnist2db.convert(images_path, labels_path, db, backend, shuffle=True, seed=9)
        assert [k for k, _ in records(db)] == [b"00000000", b"00000001", b"00000002"]
        with mnist2db.open_db(db) as dataset:
            assert len(dataset) == 3


# -- verify and export map records back to source items -----------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_shuffled_transposed_subset_round_trips_through_verify_and_export(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    from mnist2db.exporting.to_idx import export_db
    from mnist2db.verify import verify_db

    images_path, labels_path, images, labels = mnist_pair(1300, rows=4, cols=6)
    db = tmp_path / "db"
    mnist2db.convert(
        images_path, labels_path, db, backend,
        transpose=True, shuffle=True, seed=11, offset=100, count=1150,
    )  # fmt: skip
    assert verify_db(db, images_path, labels_path).count == 1150
    result = export_db(db, tmp_path / "out", prefix="sub")
    assert (result.rows, result.cols, result.count) == (4, 6, 1150)
    assert result.notes == (
        f"items 100 … 1249 of {images_path}",
        "put back in source order (shuffle seed 11)",
        "images transposed back as the source stores them",
    )
    assert (tmp_path / "out/sub-images-idx3-ubyte").read_bytes() == idx_bytes(images[100:1250])
    assert (tmp_path / "out/sub-labels-idx1-ubyte").read_bytes() == idx_bytes(labels[100:1250])


def test_a_range_of_no_items_is_named_as_none(tmp_path: Path, mnist_pair: Pair) -> None:
    # --offset at the end (or --count 0) writes 0 records; "items 5 … 4" read as a bug.
    from mnist2db.exporting.to_idx import export_db

    images_path, labels_path, _, _ = mnist_pair(5, rows=3, cols=3)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, offset=5)
    info: Any = run("info", str(db))
    assert info.exit_code == 0, info.output
    assert "items       none, from 5 of the source (0)\n" in info.stdout
    result = export_db(db, tmp_path / "out", prefix="none")
    assert result.count == 0
    assert result.notes[0] == f"items none, from 5 of {images_path}"


def test_full_shuffle_exports_the_source_byte_for_byte(tmp_path: Path, mnist_pair: Pair) -> None:
    from mnist2db.exporting.to_idx import export_db

    images_path, labels_path, _, _ = mnist_pair(37)
    mnist2db.convert(images_path, labels_path, tmp_path / "db", shuffle=True, seed=2)
    export_db(tmp_path / "db", tmp_path / "out", prefix="x")
    assert (tmp_path / "out/x-images-idx3-ubyte").read_bytes() == images_path.read_bytes()
    assert (tmp_path / "out/x-labels-idx1-ubyte").read_bytes() == labels_path.read_bytes()


def test_verify_names_the_source_item_of_a_shuffled_record(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    import json

    from mnist2db.errors import VerifyError
    from mnist2db.verify import verify_db

    images_path, labels_path, _, _ = mnist_pair(20, rows=3, cols=3)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, shuffle=True, seed=7)
    meta = json.loads((db / METADATA_NAME).read_text())
    meta["shuffle"]["seed"] = 8  # the records no longer follow the recorded order
    (db / METADATA_NAME).write_text(json.dumps(meta))
    with pytest.raises(VerifyError) as info:
        verify_db(db, images_path, labels_path)
    message = str(info.value)
    assert message.startswith(f"{db}: key 0000000")
    item = int(permutation(8, 20)[int(message.split("key ")[1][:8])])
    assert message.endswith(f"({images_path} item {item})")
    other_images, other_labels, _, _ = mnist_pair(21, stem="other")
    with pytest.raises(VerifyError, match="made from a source of 20 items"):
        verify_db(db, other_images, other_labels)


def test_qmnist_labels_export_as_the_datum_labels_and_say_so(tmp_path: Path) -> None:
    from mnist2db.exporting.to_idx import export_db
    from mnist2db.verify import verify_db

    images = make_images(9, 28, 28)
    rows = qmnist_labels(9)
    write_idx(tmp_path / "i", images)
    (tmp_path / "l.xz").write_bytes(lzma.compress(idx_bytes(rows)))
    mnist2db.convert(tmp_path / "i", tmp_path / "l.xz", tmp_path / "db")
    assert verify_db(tmp_path / "db", tmp_path / "i", tmp_path / "l.xz").count == 9
    result = export_db(tmp_path / "db", tmp_path / "out", prefix="q")
    assert result.notes[-1] == (
        "labels: column 0 of the idx2-int source, as uint8 idx1 (the database holds no other column)"
    )
    assert (tmp_path / "out/q-images-idx3-ubyte").read_bytes() == idx_bytes(images)
    exported = mnist2db.read_idx(tmp_path / "out/q-labels-idx1-ubyte")
    assert exported.tolist() == rows[:, 0].tolist()


# -- the command line ----------------------------------------------------------------------


def run(*args: str) -> object:
    from click.testing import CliRunner

    from mnist2db.cli.app import cli

    return CliRunner().invoke(cli, list(args))


def test_cli_convert_options(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(12, rows=2, cols=5)
    i, lb = str(images_path), str(labels_path)
    result: Any = run("convert", i, lb, str(tmp_path / "a"), "--shuffle", "--transpose")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[1] == "Rows: 5 Cols: 2"
    seed = int(lines[3].removeprefix("Shuffled with seed ").split()[0])
    assert lines[3] == f"Shuffled with seed {seed} (--seed {seed} repeats it)."
    assert lines[4] == "Images transposed (height and width swapped)."
    result = run(
        "convert", i, lb, str(tmp_path / "b"), "--shuffle", "--transpose", "--seed", str(seed)
    )
    assert result.exit_code == 0
    assert records(tmp_path / "a") == records(tmp_path / "b")
    result = run("convert", i, lb, str(tmp_path / "c"), "--seed", "1")
    assert (
        result.exit_code == 2 and "Error: --seed orders a shuffle: add --shuffle" in result.stderr
    )
    result = run("convert", i, lb, str(tmp_path / "c"), "--offset", "10", "--count", "3")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {i}: items 10 … 12 do not fit: it holds 12 items (0 … 11)\n"
    result = run("convert", i, lb, str(tmp_path / "c"), "--label-column", "1")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert not (tmp_path / "c").exists()
    info: Any = run("info", str(tmp_path / "a"))
    assert info.exit_code == 0
    assert f"order       shuffled, seed {seed} " in info.stdout
    assert "orientation transposed (height and width swapped)\n" in info.stdout
    verify: Any = run("verify", str(tmp_path / "a"), i, lb)
    assert verify.exit_code == 0, verify.output


def test_fast_path_hands_new_options_to_click() -> None:
    from mnist2db.__main__ import parse_convert

    assert parse_convert(["convert", "a", "b", "c"]) is not None
    for option in ("--shuffle", "--transpose", "--offset=1", "--label-column=2"):
        assert parse_convert(["convert", option, "a", "b", "c"]) is None


def test_show_transposes_and_reads_idx2_int_and_xz(tmp_path: Path) -> None:
    images = np.zeros((2, 2, 4), dtype=np.uint8)
    images[0, 0, :] = 255  # the top row lit: after transposing, the left column
    rows = qmnist_labels(2)
    write_idx(tmp_path / "qmnist-test-images-idx3-ubyte", images)
    (tmp_path / "qmnist-test-labels-idx2-int.xz").write_bytes(lzma.compress(idx_bytes(rows)))
    source = str(tmp_path / "qmnist-test-images-idx3-ubyte")
    result: Any = run("show", source, "--count", "1", "--threshold", "0", "--label-column", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == [f"#0  label {rows[0, 2]}", "1 1 1 1", "0 0 0 0"]
    result = run("show", source, "--count", "1", "--threshold", "0", "--transpose")
    assert result.stdout.splitlines()[1:5] == ["1 0", "1 0", "1 0", "1 0"]
    info: Any = run("info", str(tmp_path / "qmnist-test-labels-idx2-int.xz"))
    assert info.exit_code == 0, info.output
    assert "magic       0x00000c02 (QMNIST label rows, idx2-int)" in info.stdout
    assert info.stdout.splitlines()[1].startswith("storage     xz, ")


def test_backends_leave_the_metadata_file_alone_when_writing(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    """LevelDB's ParseFileName (db/filename.cc) owns CURRENT, LOCK, LOG, LOG.old,
    MANIFEST-<n> and <n>.(log|sst|ldb|dbtmp) only, and deletes only owned files."""
    import lmdb
    import plyvel

    images_path, labels_path, _, _ = mnist_pair(30)
    for backend in ("lmdb", "leveldb"):
        db = tmp_path / backend
        mnist2db.convert(images_path, labels_path, db, backend, shuffle=True, seed=4)
        before = (db / METADATA_NAME).read_bytes()
        if backend == "leveldb":
            handle = plyvel.DB(str(db))
            handle.put(b"zzz", b"x")
            handle.compact_range()
            handle.delete(b"zzz")
            handle.compact_range()
            handle.close()
        else:
            env = lmdb.open(str(db), map_size=1 << 24)
            with env.begin(write=True) as txn:
                txn.put(b"zzz", b"x")
                txn.delete(b"zzz")
            env.close()
        assert (db / METADATA_NAME).read_bytes() == before
        assert len(records(db)) == 30


def test_show_transpose_swaps_every_element_of_idx_and_database_records(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    from mnist2db.show import select_records

    images_path, labels_path, images, _ = mnist_pair(4, rows=3, cols=5)
    mnist2db.convert(images_path, labels_path, tmp_path / "db")
    for source in (images_path, tmp_path / "db"):
        total, shown = select_records(source, offset=1, count=2, transpose=True)
        got = list(shown)
        assert total == 4 and [r.index for r in got] == [1, 2]
        for record in got:
            assert record.image.shape == (1, 5, 3)
            for r in range(3):
                for c in range(5):
                    assert record.image[0, c, r] == images[record.index, r, c]


def test_xz_through_a_pipe_is_read_as_a_stream(tmp_path: Path, mnist_pair: Pair) -> None:
    import subprocess
    import sys

    images_path, labels_path, _, _ = mnist_pair(9, rows=4, cols=4)
    mnist2db.convert(images_path, labels_path, tmp_path / "plain")
    packed = lzma.compress(images_path.read_bytes())
    code = "from mnist2db.cli.app import main; main()"
    args = ["convert", "-q", "/dev/stdin", str(labels_path), str(tmp_path / "piped")]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], input=packed, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert records(tmp_path / "piped") == records(tmp_path / "plain")
    cut = subprocess.run(
        [sys.executable, "-c", code, *args[:-1], str(tmp_path / "cut")],
        input=lzma.compress(images_path.read_bytes()[:-3]),
        capture_output=True,
        check=False,
    )
    assert cut.returncode == 1
    assert cut.stderr.decode().startswith("Error: /dev/stdin: truncated: header declares 144")
    assert not (tmp_path / "cut").exists()


def test_any_path_bytes_are_recorded_and_shown(tmp_path: Path) -> None:
    import subprocess
    import sys

    odd = os.fsencode(tmp_path) + b"/caf\xe9-images"
    with open(odd, "wb") as f:
        f.write(idx_bytes(make_images(3, 2, 2)))
    write_idx(tmp_path / "labels", np.array([1, 2, 3], dtype=np.uint8))
    db = tmp_path / "db"
    mnist2db.convert(os.fsdecode(odd), tmp_path / "labels", db, shuffle=True, seed=1)
    meta = read_metadata(db)
    assert meta is not None and os.fsencode(meta[1]["source"]["images"]) == odd
    code = "from mnist2db.cli.app import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "info", str(db)], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert b"caf\\xe9-images + " in done.stdout
    assert (
        subprocess.run(
            [sys.executable, "-c", code, "verify", str(db), odd, str(tmp_path / "labels")],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_shuffle_on_a_full_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path, mnist_pair: Pair, backend: str
) -> None:
    images_path, labels_path, _, _ = mnist_pair(6000)  # 4.7 MB of pixels to spill
    with mounted_tmpfs(tmp_path / "small", "4m") as mount:
        result: Any = run(
            "convert", "-q", "--shuffle", f"--backend={backend}",
            str(images_path), str(labels_path), str(mount / "db"),
        )  # fmt: skip
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: {mount / 'db'}: ")
        assert result.stderr.count("\n") == 1, result.stderr
        # The spill file, unlinked, frees its space as it fails: strerror says why.
        assert result.stderr == (
            f"Error: {mount / 'db'}: cannot hold a temporary copy of the images: "
            "No space left on device\n"
        )
        assert os.listdir(mount) == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(0, 40),
    rows=st.integers(1, 5),
    cols=st.integers(1, 5),
    data=st.data(),
)
def test_any_recipe_round_trips_through_convert_and_export(
    tmp_path_factory: pytest.TempPathFactory, count: int, rows: int, cols: int, data: Any
) -> None:
    from mnist2db.exporting.to_idx import export_db
    from mnist2db.verify import verify_db

    offset = data.draw(st.integers(0, count))
    selected = data.draw(st.integers(0, count - offset))
    transpose = data.draw(st.booleans())
    seed = data.draw(st.none() | st.integers(0, 2**64 - 1))
    backend = data.draw(st.sampled_from(["lmdb", "leveldb"]))
    work = tmp_path_factory.mktemp("roundtrip")
    images = make_images(count, rows, cols, seed=count)
    labels = np.arange(count, dtype=np.uint8) % 10
    write_idx(work / "i", images)
    write_idx(work / "l", labels)
    mnist2db.convert(
        work / "i", work / "l", work / "db", backend, transpose=transpose,
        shuffle=seed is not None, seed=seed, offset=offset, count=selected, batch_size=7,
    )  # fmt: skip
    assert verify_db(work / "db", work / "i", work / "l").count == selected
    result = export_db(work / "db", work / "out", prefix="x")
    assert result.count == selected
    stop = offset + selected
    if selected:
        assert (work / "out/x-images-idx3-ubyte").read_bytes() == idx_bytes(images[offset:stop])
    assert (work / "out/x-labels-idx1-ubyte").read_bytes() == idx_bytes(labels[offset:stop])


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{bad", "not JSON: Expecting property name enclosed in double quotes, line 1 column 2"),
        (b"\xff\xfe", "not UTF-8 text: byte 0xff at offset 0"),
        (b"[1]", "its JSON is not an object"),
        (b'{"format": "mnist2db database metadata", "version": 1}', "no field 'source'"),
        (None, "not a regular file (a directory)"),
    ],
)
def test_a_damaged_metadata_file_is_named_in_plain_words(
    tmp_path: Path, mnist_pair: Pair, content: bytes | None, why: str
) -> None:
    images_path, labels_path, _, _ = mnist_pair(3, rows=2, cols=2)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, count=2)
    meta = db / "mnist2db.json"
    meta.unlink()
    if content is None:
        meta.mkdir()
    else:
        meta.write_bytes(content)
    result: Any = run("info", str(db))
    assert result.exit_code == 1
    verb = "cannot read mnist2db's metadata: " if content is None else "not mnist2db's metadata ("
    close = "" if content is None else ")"
    assert result.stderr == f"Error: {meta}: {verb}{why}{close}\n"
