"""close() while other threads read: no native crash, no raw Python error, and the dataset
reads on (reopened) when used again; a database replaced meanwhile is never read as half
of each. Real threads, in a real child process (a crash is its exit status, not pytest's)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx

import mnist2db
from mnist2db import BackendError, convert, open_db
from mnist2db.cli.app import cli

# Four threads read through every way a dataset reads (db[i] on the hot path, slices,
# batched fetch, read_range, iteration, keys, and a reader of their own) and check every
# label; the main thread closes the dataset as fast as it can, until it has closed it 200
# times and the readers have read 20 rounds (counts, so that a busy machine only takes longer).
_HAMMER = r"""
import sys, threading, time
import numpy as np
import mnist2db

path = sys.argv[1]
labels = np.frombuffer(open(sys.argv[2], "rb").read()[8:], np.uint8).astype(int).tolist()
db = mnist2db.open_db(path)
n = len(db)
stop = threading.Event()
errors, reads = [], [0]

def check(i, label):
    if label != labels[i]:
        raise AssertionError(f"record {i}: label {label}, expected {labels[i]}")

def reader(seed):
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        try:
            i = int(rng.integers(n))
            check(i, db[i][1])
            check(i, db[i - n][1])
            for j, (_, label) in zip(range(i, i + 3), db[i:i + 3]):
                check(j, label)
            for j, (_, label) in zip([i, 0], db.__getitems__([i, 0])):
                check(j, label)
            images, got = db.read_range(i, i + 5)
            for j, label in zip(range(i, i + 5), got.tolist()):
                check(j, label)
            if seed == 0:
                for j, (_, label) in enumerate(db):
                    check(j, label)
            if seed == 1:
                for j, (key, datum) in enumerate(mnist2db.iter_db(path)):
                    check(j, datum.label)
            reads[0] += 1
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return

threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
for thread in threads:
    thread.start()
closes = 0
# Counts, not a time window: a loaded machine reaches them later, never fewer of them.
end = time.monotonic() + 60
while (closes < 200 or reads[0] < 20) and time.monotonic() < end and not errors:
    db.close()
    closes += 1
    time.sleep(0.0005 * (closes % 3))
stop.set()
for thread in threads:
    thread.join()
check(n - 1, db[n - 1][1])  # used again after all that: reopened
db.close()
print(f"closes {closes} reads {reads[0]} errors {len(errors)}")
for error in errors[:3]:
    print(error)
sys.exit(1 if errors else 0)
"""


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    base = tmp_path_factory.mktemp("closing")
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (600, 6, 5), dtype=np.uint8)
    labels = rng.integers(0, 256, 600, dtype=np.uint8)
    image_path, label_path = write_idx(base / "i", images), write_idx(base / "l", labels)
    paths = {}
    for backend in ("lmdb", "leveldb"):
        paths[backend] = base / f"db_{backend}"
        convert(image_path, label_path, paths[backend], backend)
    # PNG records: labels of 128 and more take the general path, the others the fast ones
    paths["lmdb-png"] = base / "db_lmdb_png"
    convert(image_path, label_path, paths["lmdb-png"], "lmdb", encoded="png")
    return paths, label_path


@pytest.mark.parametrize("backend", ["lmdb", "leveldb", "lmdb-png"])
def test_close_while_threads_read_never_crashes(databases, backend: str) -> None:
    """Today's main: LevelDB ends in SIGSEGV, LMDB readers get AttributeError."""
    paths, label_path = databases
    done = subprocess.run(
        [sys.executable, "-c", _HAMMER, str(paths[backend]), str(label_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    closes, reads = (int(word) for word in done.stdout.split()[1:4:2])
    assert closes >= 200 and reads >= 20, done.stdout


@pytest.mark.parametrize("backend", ["lmdb", "leveldb", "lmdb-png"])
def test_an_iteration_finishes_across_close_in_another_thread(databases, backend: str) -> None:
    paths, label_path = databases
    labels = np.frombuffer(label_path.read_bytes()[8:], np.uint8).tolist()
    db = open_db(paths[backend])
    records = iter(db)
    reader = mnist2db.open_reader(paths[backend])
    keys = iter(reader)
    first = [next(records)[1] for _ in range(10)]
    next(keys)
    closer = threading.Thread(target=lambda: (db.close(), reader.close()))
    closer.start()
    closer.join()
    rest = [label for _, label in records]
    assert first + rest == labels
    assert sum(1 for _ in keys) == len(labels) - 1  # the reader's iteration, too
    with pytest.raises(BackendError, match="the reader is closed"):
        reader.get(b"00000000")  # a closed reader says so; a dataset opens again:
    assert db[len(labels) - 1][1] == labels[-1]
    db.close()


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_a_dataset_used_after_close_reads_the_database_it_opened_or_says_why(
    tmp_path: Path, backend: str
) -> None:
    """convert --overwrite between close() and the next read: the dataset's length, keys
    and layout are those of the old database; reading the new one under them would mix
    two versions, so it says so instead."""
    first = write_idx(tmp_path / "i1", np.full((4, 2, 2), 1, np.uint8))
    labels = write_idx(tmp_path / "l1", np.arange(4, dtype=np.uint8))
    path = tmp_path / "db"
    convert(first, labels, path, backend)
    db = open_db(path)
    assert db[3][1] == 3
    db.close()
    assert db[2][1] == 2  # reopened: the same database
    db.close()
    other = write_idx(tmp_path / "i2", np.full((9, 3, 3), 7, np.uint8))
    other_labels = write_idx(tmp_path / "l2", np.arange(9, dtype=np.uint8))
    convert(other, other_labels, path, backend, overwrite=True)
    with pytest.raises(BackendError) as caught:
        db[0]
    assert str(caught.value) == (
        f"{path}: the database was replaced while it was being read (convert --overwrite?); "
        "open it again"
    )
    with open_db(path) as again:
        assert len(again) == 9 and again[8][1] == 8


def test_pickled_dataset_checks_it_finds_the_same_database(tmp_path: Path) -> None:
    import pickle

    images = write_idx(tmp_path / "i", np.full((3, 2, 2), 1, np.uint8))
    labels = write_idx(tmp_path / "l", np.arange(3, dtype=np.uint8))
    path = tmp_path / "db"
    convert(images, labels, path)
    with open_db(path) as db:
        state = pickle.dumps(db)
    assert pickle.loads(state)[2][1] == 2
    convert(images, labels, path, overwrite=True)
    with pytest.raises(BackendError, match="was replaced while it was being read"):
        pickle.loads(state)[0]


# -- paths and files a reader is given ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_reader_takes_a_bytes_path_as_its_docstring_says(databases, backend: str) -> None:
    """open_db and iter_db raised TypeError for a bytes path; info, verify, export too."""
    from mnist2db.exporting.to_idx import export_db
    from mnist2db.info import db_info

    paths, label_path = databases
    path = bytes(paths[backend])
    labels = np.frombuffer(label_path.read_bytes()[8:], np.uint8).tolist()
    with open_db(path) as db:
        assert db.path == str(paths[backend]) and db[599][1] == labels[599]
    assert [d.label for _, d in mnist2db.iter_db(path)] == labels
    assert db_info(path).count == 600
    assert mnist2db.compute_mean(path).count == 600
    out = paths[backend].parent / f"exported_{backend}"
    result = export_db(path, bytes(out), prefix="x")
    assert Path(result.labels).read_bytes() == label_path.read_bytes()


def test_read_range_takes_negative_bounds_as_a_slice(databases) -> None:
    """read_range(-5, -1) returned nothing while db[-5:-1] gave four records."""
    paths, label_path = databases
    labels = np.frombuffer(label_path.read_bytes()[8:], np.uint8).tolist()
    with open_db(paths["lmdb"]) as db:
        for start, stop in ((-5, -1), (-5, None), (-700, 3), (590, -5), (-1, -5), (3, 700)):
            images, got = db.read_range(start, stop)
            assert got.tolist() == labels[start:stop] == [label for _, label in db[start:stop]]
            assert images.shape == (len(labels[start:stop]), 1, 6, 5)
        assert [r[3] for r in db.records(-3)] == labels[-3:]


@pytest.mark.parametrize(
    ("backend", "name"), [("lmdb", "data.mdb"), ("leveldb", "CURRENT"), ("leveldb", "table")]
)
def test_a_fifo_among_a_databases_files_is_named_never_waited_on(
    tmp_path: Path, backend: str, name: str
) -> None:
    """A FIFO data.mdb was reported as 'no data.mdb'; opened as the backend, a FIFO blocks
    for ever (no writer comes). Every reader names the file and what it is."""
    import os

    images = write_idx(tmp_path / "i", np.full((3, 2, 2), 1, np.uint8))
    labels = write_idx(tmp_path / "l", np.arange(3, dtype=np.uint8))
    db = tmp_path / "db"
    convert(images, labels, db, backend)
    if name == "table":
        name = next(p.name for p in db.iterdir() if p.suffix in (".ldb", ".log"))
    (db / name).unlink()
    os.mkfifo(db / name)
    found: list[str] = []

    def read() -> None:
        for reader in (lambda: open_db(db), lambda: list(mnist2db.iter_db(db, backend))):
            try:
                reader()
            except BackendError as exc:
                found.append(str(exc))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "a reader waits on the FIFO"
    assert len(found) == 2
    if name in ("data.mdb", "CURRENT"):
        kind = "an LMDB" if backend == "lmdb" else "a LevelDB"
        assert found[0] == f"{db / name}: not a regular file (a FIFO); not {kind} database"
    else:
        assert found[0] == (
            f"{db / name}: not a regular file (a FIFO); the leveldb database cannot be read"
        )
    assert found[1].startswith(f"{db / name}: not a regular file (a FIFO)")
    result = CliRunner().invoke(cli, ["info", str(db)])
    assert result.exit_code == 1 and result.stderr == f"Error: {found[0]}\n"


def test_keys_and_paths_with_control_characters_stay_on_one_inert_line(tmp_path: Path) -> None:
    """A key is any bytes: b'\\x1b[2J' printed raw clears the terminal, b'\\n' breaks the
    one-line rule. Keys and paths are shown with such bytes escaped."""
    from db_helpers import write_raw_db

    from mnist2db.formats.datum.message import encode_datum
    from mnist2db.info import db_info

    good = encode_datum(bytes(4), 1, 2, 2, 1)
    db = write_raw_db(tmp_path / "db", "lmdb", {b"\x1b[2J": good, b"a\nb": b"\xff"})
    info = db_info(db)
    assert (info.problem or "").startswith("key a\\x0ab: value of 1 bytes is not a Datum")
    result = CliRunner().invoke(cli, ["info", str(db)])
    assert "\x1b" not in result.output and "keys        \\x1b[2J … a\\x0ab" in result.output
    odd = tmp_path / "x\ny\x1b[31m"
    result = CliRunner().invoke(cli, ["info", str(odd)])
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path}/x\\x0ay\\x1b[31m: no such file\n"


def test_a_new_database_opens_while_a_deleted_one_is_still_read(tmp_path: Path) -> None:
    """A dataset holds database A; A is deleted and B made, and B's lock.mdb takes the inode
    A's had (the file system reuses a freed inode; a hard link makes it certain here).
    py-lmdb 3 refuses an environment whose data *or lock* file shares an inode with one open
    in the process; a reader never opens lock.mdb, so B is not that environment: it opens
    at once and reads its own records."""
    images = write_idx(tmp_path / "i", np.full((4, 2, 2), 1, np.uint8))
    labels = write_idx(tmp_path / "l", np.arange(4, dtype=np.uint8))
    first, second = tmp_path / "a", tmp_path / "b"
    convert(images, labels, first)
    other = write_idx(tmp_path / "i2", np.full((3, 2, 2), 9, np.uint8))
    convert(other, write_idx(tmp_path / "l2", np.arange(3, dtype=np.uint8)), second)
    held = open_db(first)
    assert held[3][1] == 3
    (second / "lock.mdb").unlink()
    (first / "lock.mdb").rename(second / "lock.mdb")  # B's lock file: the inode A's had
    with open_db(second) as db:
        assert len(db) == 3 and int(db[2][0].max()) == 9
    assert held[0][1] == 0
    held.close()
