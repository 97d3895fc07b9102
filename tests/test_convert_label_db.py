"""convert --label-db: QMNIST's whole label rows as a label database beside the images,
under the same keys, in the order any option gives (range, shuffle, transpose)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import make_images, make_labels, write_idx

import mnist2db
from mnist2db.cli.app import cli
from mnist2db.formats.datum.float_datum import encode_target_batch
from mnist2db.formats.datum.message import decode_datum, record_keys
from mnist2db.selection import permutation
from mnist2db.storage.databases.readers import open_reader


def qmnist_rows(count: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 100_000, size=(count, 8), dtype=np.int32)
    rows[:, 0] = rng.integers(0, 10, size=count)
    return rows


def stored(path: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(path) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_every_column_under_the_same_keys(tmp_path: Path, backend: str) -> None:
    rows = qmnist_rows(30)
    write_idx(tmp_path / "i", make_images(30, 4, 4))
    write_idx(tmp_path / "l", rows)
    out = tmp_path / "db"
    mnist2db.convert(tmp_path / "i", tmp_path / "l", out, backend, label_column=2,
                     shuffle=True, seed=4, offset=5, count=20, label_db=True)  # fmt: skip
    order = 5 + permutation(4, 20)
    images, labels = stored(out), stored(tmp_path / "db_labels")
    assert [k for k, _ in images] == [k for k, _ in labels] == list(record_keys(0, 20))
    assert [v for _, v in labels] == encode_target_batch(rows[order])
    assert [decode_datum(v).label for _, v in images] == rows[order, 2].tolist()
    with mnist2db.open_db(out, labels=tmp_path / "db_labels") as db:
        assert db[3][1].tolist() == rows[order[3]].astype(np.float32).tolist()


def test_one_label_a_record_and_the_cli(tmp_path: Path) -> None:
    labels = make_labels(12)
    write_idx(tmp_path / "i", make_images(12, 3, 3))
    write_idx(tmp_path / "l", labels)
    result = CliRunner().invoke(cli, ["convert", "--label-db", str(tmp_path / "i"),
                                      str(tmp_path / "l"), str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [v for _, v in stored(tmp_path / "out_labels")] == encode_target_batch(
        labels.reshape(-1, 1)
    )
    verified = CliRunner().invoke(cli, ["verify", str(tmp_path / "out"), str(tmp_path / "i"),
                                        str(tmp_path / "l"), "--label-db",
                                        str(tmp_path / "out_labels")])  # fmt: skip
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.splitlines()[-1] == (
        f"OK: {tmp_path}/out_labels is the label database of {tmp_path}/out: 12 records "
        "under the same keys, 1 values each."
    )


def test_a_refused_label_database_leaves_nothing(tmp_path: Path) -> None:
    write_idx(tmp_path / "i", make_images(3, 2, 2))
    write_idx(tmp_path / "l", make_labels(3))
    (tmp_path / "out_labels").write_text("mine")
    result = CliRunner().invoke(cli, ["convert", "--label-db", str(tmp_path / "i"),
                                      str(tmp_path / "l"), str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path}/out_labels: ")
    assert sorted(os.listdir(tmp_path)) == ["i", "l", "out_labels"]
    assert (tmp_path / "out_labels").read_text() == "mine"


def convert_killed(tmp_path: Path, out: Path, backend: str, kill: tuple[str, int]) -> int:
    """``mnist2db convert --label-db`` in a child process, in batches of 10, SIGKILLed at
    its n-th batch write (``("batch", n)``: the images' batches come first, then the label
    database's) or at a staging checkpoint (``("checkpoint", name)``); its exit status."""
    script = textwrap.dedent(f"""
        import os, signal
        import mnist2db.storage.databases.backends as backends
        import mnist2db.storage.files as staging
        from mnist2db.cli.app import main
        kind, at = {kill!r}
        calls = [0]
        for writer in (backends.LmdbWriter, backends.LeveldbWriter):
            def counted(self, items, *hooks, write=writer.write_batch):
                calls[0] += 1
                if kind == "batch" and calls[0] == at:
                    os.kill(os.getpid(), signal.SIGKILL)
                write(self, items, *hooks)
            writer.write_batch = counted
        def checkpoint(stage, path):
            if kind == "checkpoint" and stage == at:
                os.kill(os.getpid(), signal.SIGKILL)
        staging.checkpoint = checkpoint
        main(["convert", "--label-db", "--batch-size", "10", "--backend", {backend!r},
              {str(tmp_path / "i")!r}, {str(tmp_path / "l")!r}, {str(out)!r}])
    """)
    return subprocess.run([sys.executable, "-c", script], timeout=60).returncode


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_a_killed_pair_leaves_neither_and_runs_again(tmp_path: Path, backend: str) -> None:
    """convert has no --resume: a kill anywhere (in the images, between the two databases,
    in the labels, while the two are placed) leaves neither, and the same command run again
    writes the pair an uninterrupted run writes."""
    write_idx(tmp_path / "i", make_images(30, 4, 4))
    write_idx(tmp_path / "l", qmnist_rows(30))
    whole = tmp_path / "whole"
    mnist2db.convert(tmp_path / "i", tmp_path / "l", whole, backend, label_db=True, batch_size=10)
    # 3 image batches, then the label database's one.
    for n, kill in enumerate([("batch", 2), ("batch", 4), ("checkpoint", "databases-first")]):
        out = tmp_path / f"db{n}"
        assert convert_killed(tmp_path, out, backend, kill) == -signal.SIGKILL
        if kill[0] == "checkpoint":
            assert out.exists() and not Path(f"{out}_labels").exists()  # the journal's half
        else:
            assert not out.exists() and not Path(f"{out}_labels").exists()
        result = CliRunner().invoke(cli, ["convert", "--label-db", "--backend", backend,
                                          str(tmp_path / "i"), str(tmp_path / "l"), str(out)])  # fmt: skip
        assert result.exit_code == 0, (kill, result.stderr)
        assert stored(out) == stored(whole), kill
        assert stored(Path(f"{out}_labels")) == stored(Path(f"{whole}_labels")), kill
        assert sorted(n for n in os.listdir(tmp_path) if "mnist2db" in n) == []
    resumed = CliRunner().invoke(cli, ["convert", "--resume", str(tmp_path / "i"),
                                       str(tmp_path / "l"), str(tmp_path / "db9")])  # fmt: skip
    assert resumed.exit_code == 2
    assert "no such option" in resumed.stderr.lower() and "--resume" in resumed.stderr
