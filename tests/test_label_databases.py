"""Label databases beside image databases (mnist2db.labels.databases) and databases placed
together (mnist2db.storage.db_staging.staged_databases): same keys, same order, both or none,
a kill rolled back by the next writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mnist2db.conversion import write_database
from mnist2db.errors import OutputExistsError
from mnist2db.formats.datum.float_datum import decode_targets, encode_targets
from mnist2db.formats.datum.message import encode_datum
from mnist2db.formats.lists.label_table import open_label_table
from mnist2db.labels.databases import TargetSource, write_label_database
from mnist2db.selection import permutation
from mnist2db.storage.databases.readers import open_reader
from mnist2db.storage.db_staging import remove_stale_staging, staged_databases
from mnist2db.storage.destinations import labels_path
from mnist2db.storage.file_placement import recover_together

ROWS = b"".join(b"img %d.png %d %.3f -2.5\n" % (i, i % 2, i / 8) for i in range(10))


def stored(path: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(path) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


def write_pair(tmp_path: Path, skip: set[int], order: np.ndarray | None = None,
               backend: str = "lmdb") -> tuple[Path, Path, TargetSource]:  # fmt: skip
    """An image database of the table's entries (``skip``: lines left out, as unreadable
    images are) and its label database, placed together."""
    listing = tmp_path / "list.txt"
    listing.write_bytes(ROWS)
    source = TargetSource(open_label_table(listing, header=False), order)
    out = tmp_path / "images"
    with staged_databases([out, labels_path(out)], backend) as (images, labels):
        records = [
            (b"%08d_" % e.line + e.path, encode_datum(b"\x07", 1, 1, 1, e.label))
            for e in source.entries()
            if e.line not in skip
        ]
        write_database(backend, images, 16, [records], len(records), lambda d, t: None, keyed=True)
        result = write_label_database(backend, images, labels, source, labels_path(out))
    assert result.count == len(records)
    return out, Path(labels_path(out)), source


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_same_keys_same_order_with_skips(tmp_path: Path, backend: str) -> None:
    out, labels, _ = write_pair(tmp_path, {0, 3, 9}, backend=backend)
    assert labels.name == "images_labels"
    images, targets = stored(out), stored(labels)
    assert [k for k, _ in images] == [k for k, _ in targets]
    assert [k for k, _ in targets] == [b"%08d_img %d.png" % (i, i) for i in (1, 2, 4, 5, 6, 7, 8)]
    for key, value in targets:
        i = int(key[:8])
        assert value == encode_targets([i % 2, float("%.3f" % (i / 8)), -2.5])
    # The image record's label is the first value (an integer here).
    assert [int(v[-1]) for _, v in images] == [i % 2 for i in (1, 2, 4, 5, 6, 7, 8)]


def test_shuffled(tmp_path: Path) -> None:
    order = permutation(7, 10)
    out, labels, _ = write_pair(tmp_path, {2}, order)
    targets = stored(labels)
    assert [k for k, _ in stored(out)] == [k for k, _ in targets]
    for key, value in targets:
        position = int(key[:8])
        row = int(order[position])
        assert key == b"%08d_img %d.png" % (position, row)
        assert decode_targets(value).tolist() == pytest.approx([row % 2, row / 8, -2.5], abs=1e-3)


def test_a_failure_leaves_neither(tmp_path: Path) -> None:
    out = tmp_path / "a"
    with pytest.raises(RuntimeError), staged_databases([out, labels_path(out)], "lmdb"):
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_an_existing_one_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "a"
    Path(labels_path(out)).mkdir()
    with (
        pytest.raises(OutputExistsError) as caught,
        staged_databases([out, labels_path(out)], "lmdb"),
    ):
        raise AssertionError("not reached")
    assert (
        str(caught.value) == f"{tmp_path}/a_labels: already exists (use --overwrite to replace it)"
    )
    assert sorted(os.listdir(tmp_path)) == ["a_labels"]


KILLED = """
import os, signal, sys
import mnist2db.storage.files as files
from mnist2db.conversion import write_database
from mnist2db.storage.db_staging import staged_databases
out, stage = sys.argv[1], sys.argv[2]
def checkpoint(s, path):
    if s == stage:
        os.kill(os.getpid(), signal.SIGKILL)
files.checkpoint = checkpoint
with staged_databases([out, out + "_labels"], "lmdb", overwrite=True) as dirs:
    for d in dirs:
        write_database("lmdb", d, 8, [[b"new"]], 1, lambda d, t: None)
"""


def run_killed(out: Path, stage: str) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED, str(out), stage], check=False)
    assert done.returncode == -signal.SIGKILL


def test_a_kill_between_the_two_is_rolled_back(tmp_path: Path) -> None:
    out = tmp_path / "a"
    run_killed(out, "databases-first")
    # The first is in place, the journal beside it, the second still staged.
    names = sorted(os.listdir(tmp_path))
    assert "a" in names and "a_labels" not in names
    assert any(".mnist2db-pair-" in n for n in names)
    remove_stale_staging(out)  # what the next writer of either does first
    assert os.listdir(tmp_path) == []


def test_a_kill_between_the_two_puts_back_what_was_replaced(tmp_path: Path) -> None:
    out = tmp_path / "a"
    for path in (str(out), labels_path(out)):
        with staged_databases([path], "lmdb") as (d,):
            write_database("lmdb", d, 8, [[b"old"]], 1, lambda d, t: None)
    run_killed(out, "databases-first")
    assert [v for _, v in stored(out)] == [b"new"]
    recover_together([labels_path(out)])  # from either side of the pair
    remove_stale_staging(out)
    remove_stale_staging(labels_path(out))
    assert sorted(os.listdir(tmp_path)) == ["a", "a_labels"]
    assert [v for _, v in stored(out)] == [b"old"]
    assert [v for _, v in stored(Path(labels_path(out)))] == [b"old"]


def test_a_kill_before_or_after_leaves_neither_or_both(tmp_path: Path) -> None:
    for stage, expected in (("staged", []), ("placed", ["a", "a_labels"])):
        out = tmp_path / stage / "a"
        out.parent.mkdir()
        run_killed(out, stage)
        remove_stale_staging(out)
        remove_stale_staging(labels_path(out))
        assert sorted(os.listdir(out.parent)) == expected


def test_a_journal_of_a_live_run_or_of_other_files_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "a"
    live = tmp_path / f".a.mnist2db-pair-{os.getppid()}-abc123"
    live.write_text("[]")
    fifo = tmp_path / ".a.mnist2db-pair-999999999-abc123"
    os.mkfifo(fifo)
    other = tmp_path / ".b.mnist2db-pair-999999998-abc123"
    other.write_text(textwrap.dedent('[{"target": "/etc", "staging": "/tmp/x", "new": [1, 2]}]'))
    recover_together([out])
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, fifo.name, other.name])
