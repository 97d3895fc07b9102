"""Fuzzed bytes of real databases: thousands of single- and multi-byte changes to the
pages of LMDB databases (tree and overflow pages, meta pages) and to the files of LevelDB
databases (log, table, manifest, CURRENT), each read by open_db in every way (iteration,
db[i], __getitems__): the records read are the ones written, or the database is refused
with one Mnist2dbError line, or (LMDB keeps no checksums) changed records are read, and
then ``verify DB`` finds the change (the digest in mnist2db.json). Never a signal, a hang or another
exception: the cases run in a child process, which reports each outcome, so a crash fails
the test (naming the case) instead of the suite.

Seeded and bounded: the default run is a few thousand cases; MNIST2DB_PAGE_FUZZ=N runs N
times as many (other seeds), for a report.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import make_images, make_labels, write_idx
from lmdb_helpers import PAGE, read_layout

from mnist2db import Mnist2dbError, convert, open_db
from mnist2db.errors import VerifyError
from mnist2db.verify import verify_db

SCALE = int(os.environ.get("MNIST2DB_PAGE_FUZZ", "1") or "1")
SEED = 27
LMDB_CASES = 2000 * SCALE
LEVELDB_CASES = 600 * SCALE
#: Seconds a child may spend on one case before it counts as a hang (SIGALRM).
CASE_SECONDS = 20

Case = tuple[str, list[tuple[str, int, bytes]]]  # (source, [(file, offset, new bytes)])


def write(base: Path, name: str, count: int, rows: int, cols: int, backend: str) -> Path:
    images = write_idx(base / f"{name}-images-idx3-ubyte", make_images(count, rows, cols))
    labels = write_idx(base / f"{name}-labels-idx1-ubyte", make_labels(count))
    convert(images, labels, base / name, backend=backend)
    return base / name


def read_all(path: Path) -> list[tuple[bytes, int]] | str:
    """Every record by iteration, db[i] and __getitems__ (the same, or "differ"), or the
    one line the database is refused with."""
    try:
        with open_db(path) as db:
            records = [(image.tobytes(), label) for image, label in db]
            indexed = [(image.tobytes(), label) for image, label in (db[i] for i in range(len(db)))]
            batch = [(image.tobytes(), label) for image, label in db.__getitems__(range(len(db)))]
    except Mnist2dbError as exc:
        text = str(exc)
        return (
            f"refused: {text}"
            if text and "\n" not in text
            else f"escaped: a message of lines: {text!r}"
        )
    except Exception as exc:  # noqa: BLE001 - what escaped is the finding
        return f"escaped: {type(exc).__name__}: {exc}"
    if not records == indexed == batch:
        return "changed"  # a key changed to its neighbour's: a lookup finds one of the two
    return records


def in_child(cases: list[Case], work: Callable[[Case], str]) -> list[str]:
    """``work(case)`` for every case, in a forked child that reports each outcome on a
    pipe; a child that dies (a signal, or SIGALRM after CASE_SECONDS: a hang) is noted for
    its case and a new child goes on with the next."""
    outcomes: list[str] = []
    while len(outcomes) < len(cases):
        start = len(outcomes)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.close(read_end)
                for case in cases[start:]:
                    signal.alarm(CASE_SECONDS)
                    os.write(write_end, work(case).replace("\n", " ").encode() + b"\n")
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            outcomes += pipe.read().decode().splitlines()
        _, status = os.waitpid(pid, 0)
        if len(outcomes) < len(cases):
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"status {status}"
            outcomes.append(f"died: {how} reading {cases[len(outcomes)]}")
    return outcomes


def changes(rng: random.Random, size: int, hot: list[int]) -> list[tuple[int, bytes]]:
    """One change to a file of ``size`` bytes: a byte (half the cases), a run of 2 to 8
    bytes, or 2 to 4 bytes scattered; at a ``hot`` offset (headers, nodes) half the time."""

    def offset(width: int = 1) -> int:
        if hot and rng.random() < 0.5:
            return min(size - width, rng.choice(hot) + rng.randrange(16))
        return rng.randrange(size - width + 1)

    kind = rng.random()
    if kind < 0.5:
        return [(offset(), bytes([rng.randrange(256)]))]
    if kind < 0.8:
        width = rng.randint(2, 8)
        return [(offset(width), rng.randbytes(width))]
    return [(offset(), bytes([rng.randrange(256)])) for _ in range(rng.randint(2, 4))]


def apply(source: Path, work_dir: Path, edits: list[tuple[str, int, bytes]]) -> Path:
    shutil.copytree(source, work_dir)
    for name, offset, new in edits:
        with open(work_dir / name, "r+b") as file:
            file.seek(offset)
            file.write(new)
    return work_dir


def tally(
    outcomes: list[str], expected: dict[str, object], cases: list[Case]
) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for outcome in outcomes:
        counts[outcome.split(":")[0]] += 1
    print(f"\n{len(cases)} cases: {dict(counts)}")  # shown with pytest -s, for a report
    bad = [o for o in outcomes if o.startswith(("died", "escaped"))]
    assert not bad, bad[:5]
    return counts


@pytest.fixture(scope="module")
def lmdb_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz_lmdb")
    # 200 records of 6 x 5: a branch root over 3 leaves; 6 of 64 x 64: 12 overflow pages.
    return {
        "raw": write(base, "raw", 200, 6, 5, "lmdb"),
        "big": write(base, "big", 6, 64, 64, "lmdb"),
    }


def test_lmdb_page_fuzz(lmdb_sources: dict[str, Path], tmp_path: Path) -> None:
    rng = random.Random(SEED * SCALE)
    expected = {name: read_all(path) for name, path in lmdb_sources.items()}
    hot, sizes = {}, {}
    for name, path in lmdb_sources.items():
        data = (path / "data.mdb").read_bytes()
        layout = read_layout(data)
        pages = range(len(data) // PAGE)
        hot[name] = [p * PAGE for p in pages] + [page * PAGE + ptr for page, ptr, _ in layout.nodes]
        hot[name] += [p * PAGE + 16 for p in (0, 1)] + [p * PAGE + 100 for p in (0, 1)]  # metas
        sizes[name] = len(data)
    cases: list[Case] = []
    for i in range(LMDB_CASES):
        name = "raw" if i % 2 else "big"
        cases.append((name, [("data.mdb", o, b) for o, b in changes(rng, sizes[name], hot[name])]))

    def work(case: Case) -> str:
        name, edits = case
        db = apply(lmdb_sources[name], tmp_path / "case", edits)
        try:
            found = read_all(db)
            if isinstance(found, str) or found == expected[name]:
                return found if isinstance(found, str) else "same"
            try:
                verify_db(db)
            except VerifyError:
                return "changed"  # and verify's digest finds it
            return f"escaped: changed records that verify passed: {case}"
        finally:
            shutil.rmtree(db)

    counts = tally(in_child(cases, work), expected, cases)
    assert counts["refused"] > LMDB_CASES // 10 and counts["same"] + counts["changed"] > 0


@pytest.fixture(scope="module")
def leveldb_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz_leveldb")
    logged = write(base, "log", 200, 6, 5, "leveldb")  # mnist2db's writer: all in the log
    tables = write(base, "table", 200, 6, 5, "leveldb")
    with open_db(tables) as db:  # LevelDB's recovery writes the log into a table
        assert len(db) == 200
    assert any(entry.suffix == ".ldb" for entry in tables.iterdir())
    return {"log": logged, "table": tables}


def test_leveldb_file_fuzz(leveldb_sources: dict[str, Path], tmp_path: Path) -> None:
    rng = random.Random(SEED * SCALE + 1)
    # Read from copies: LevelDB's recovery would move the source's log into a table.
    expected = {
        name: read_all(apply(path, tmp_path / f"expected-{name}", []))
        for name, path in leveldb_sources.items()
    }
    assert all(isinstance(records, list) and len(records) == 200 for records in expected.values())
    files = {
        name: [
            e.name
            for e in sorted(path.iterdir())
            if e.stat().st_size and e.name not in ("LOG", "LOG.old")
        ]
        for name, path in leveldb_sources.items()
    }
    cases: list[Case] = []
    for i in range(LEVELDB_CASES):
        name = "log" if i % 2 else "table"
        # By size (most bytes are records), or any file (manifest, CURRENT) a third of the time.
        sizes = [(leveldb_sources[name] / f).stat().st_size for f in files[name]]
        file = rng.choice(files[name]) if rng.random() < 0.3 else rng.choices(files[name], sizes)[0]
        size = (leveldb_sources[name] / file).stat().st_size
        hot = [0, max(0, size - 64)]  # a log's first record; a table's index and footer
        cases.append((name, [(file, o, b) for o, b in changes(rng, size, hot)]))

    def work(case: Case) -> str:
        name, edits = case
        db = apply(leveldb_sources[name], tmp_path / "case", edits)
        try:
            found = read_all(db)
        finally:
            shutil.rmtree(db)
        if isinstance(found, str):
            return found
        return "same" if found == expected[name] else f"changed: {case}"

    counts = tally(in_child(cases, work), expected, cases)
    # LevelDB checksums its log records and table blocks: a change is refused or harmless.
    assert counts["changed"] == 0 and counts["refused"] > LEVELDB_CASES // 4
