"""export --to files and --to idx against a hostile or careless user: a link planted where
the export writes (its staging directory, a directory it made) is never followed out of
OUT, and every list line reads back (keys whose path begins or ends with a blank)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_raw_db
from PIL import Image
from test_hostile_export_shards import fashion_db, one_line_refusal, snapshot

from mnist2db import iter_db
from mnist2db.cli.app import cli


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _plant_in_staging(monkeypatch, plant) -> None:
    """Have ``plant(staging)`` run in the export's staging directory as soon as it is made
    (a link put there by someone else while the export runs)."""
    from mnist2db.exporting.image_files import folder

    real = folder.staged_tree

    @contextlib.contextmanager
    def staged(out, inputs, overwrite):
        with real(out, inputs, overwrite) as staging:
            plant(Path(staging))
            yield staging

    monkeypatch.setattr(folder, "staged_tree", staged)


@pytest.mark.parametrize("name", ["9", "list.txt", "export.json"])
def test_a_link_planted_in_the_staging_directory_is_never_followed(tmp_path, monkeypatch,
                                                                   name) -> None:  # fmt: skip
    db = fashion_db(tmp_path / "db", 30)  # labels 0-9: a folder a label
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim.txt"
    victim.write_text("the user's")
    target = elsewhere if name == "9" else victim
    _plant_in_staging(monkeypatch, lambda staging: (staging / name).symlink_to(target))
    result = run("export", "--to", "files", db, tmp_path / "out")
    one_line_refusal(result, f"{tmp_path / 'out'}")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.txt"]
    assert victim.read_text() == "the user's"
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".mnist2db-tmp-" in p.name]


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _encoded(data: bytes, label: int) -> bytes:
    from mnist2db.datum_pb2 import Datum

    datum = Datum()
    datum.channels, datum.height, datum.width = 1, 4, 4
    datum.data, datum.encoded, datum.label = data, True, label
    return datum.SerializeToString()


def test_keys_whose_path_has_a_blank_at_an_end_read_back(tmp_path: Path) -> None:
    """A convert_imageset key of a path beginning or ending with a blank: no list line
    reads that path back, so its file is written under a mapped name the list names; the
    round trip through imageset keeps every record, its bytes and its label."""
    records = {
        b"00000000_ lead.png": _encoded(_png(10), 1),
        b"00000001_trail.png ": _encoded(_png(20), 2),
        b"00000002_both .png": _encoded(_png(30), 3),
        b"00000003_ok.png": _encoded(_png(40), 4),
    }
    db = write_raw_db(tmp_path / "db", "lmdb", records)
    out = tmp_path / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 0, result.output
    lines = (out / "list.txt").read_text().splitlines()
    assert len(lines) == 4 and lines[2:] == ["both .png 3", "ok.png 4"]
    for line in lines[:2]:
        assert line == line.strip() and (out / line.rsplit(" ", 1)[0]).is_file()
    again = tmp_path / "again"
    result = run("imageset", "--list", out / "list.txt", "--encoded", "file", out, again)
    assert result.exit_code == 0, result.output
    back = [(datum.data, datum.label) for _, datum in iter_db(again)]
    assert sorted(back) == sorted((data, label) for data, label in
                                  [(_png(v), v // 10) for v in (10, 20, 30, 40)])  # fmt: skip


def test_idx_export_never_writes_through_a_link_put_in_place_of_a_directory_it_made(
    tmp_path: Path, monkeypatch
) -> None:
    """The directory --to idx makes for OUT, swapped for a link before the files are
    written into it: refused, nothing written where the link points."""
    import mnist2db.exporting.to_idx as export

    db = fashion_db(tmp_path / "db", 5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = export.make_parents

    def swapped(directory):
        made = real(directory)
        os.rmdir(directory)
        os.symlink(elsewhere, directory)
        return made

    monkeypatch.setattr(export, "make_parents", swapped)
    out = tmp_path / "new" / "idx"
    result = run("export", db, out)
    one_line_refusal(result, str(out))
    assert list(elsewhere.iterdir()) == []
    before = snapshot(tmp_path / "elsewhere")
    assert before == {}


def test_a_hand_edited_export_json_is_refused_in_one_line(tmp_path: Path) -> None:
    """export.json read back by --overwrite is a stranger's input: every field checked (a
    string of two lines among the counts gives one line), a seeded fuzz of its fields."""
    import json
    import random

    from test_hostile_export_fuzz import random_value

    db = fashion_db(tmp_path / "db", 5)
    out = tmp_path / "out"
    assert run("export", "--to", "files", db, out).exit_code == 0
    marker = json.loads((out / "export.json").read_text())
    rng = random.Random(7)
    counts = {"cases": 0, "refused": 0, "correct": 0}
    for case in range(120):
        edited = dict(marker)
        field = rng.choice([*marker, "extra"])
        edited[field] = "1\n2" if case == 0 else random_value(rng)
        (out / "export.json").write_text(json.dumps(edited))
        before = snapshot(tmp_path)
        result = run("export", "--to", "files", "--overwrite", db, out)
        counts["cases"] += 1
        assert result.exception is None or isinstance(result.exception, SystemExit)
        if result.exit_code == 0:
            assert json.loads((out / "export.json").read_text()) == marker
            counts["correct"] += 1
            continue
        one_line_refusal(result, f"{out}: ", "refusing to replace it")
        assert snapshot(tmp_path) == before
        counts["refused"] += 1
    print(f"export.json fuzz: {counts}")
    assert counts["refused"] > 50 and counts["correct"] > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the file writer needs two CPUs")
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_file_writer_never_holds_up_an_interruption(tmp_path: Path, sig, code) -> None:
    from test_hostile_export_shards import _children

    db = fashion_db(tmp_path / "db", 10000)  # small files: a file-writing process is forked
    out = tmp_path / "out"
    errors = tmp_path / "stderr"
    with errors.open("wb") as stream:
        child = subprocess.Popen([sys.executable, "-m", "mnist2db", "export", "--to", "files",
                                  "--quiet", str(db), str(out)], stderr=stream)  # fmt: skip
    worker = None
    try:
        deadline = time.monotonic() + 60
        while worker is None and child.poll() is None and time.monotonic() < deadline:
            workers = _children(child.pid)
            worker = workers[0] if workers else None
        assert worker is not None, "no file-writing process was forked"
        os.kill(worker, signal.SIGSTOP)
        time.sleep(0.5)  # the export now waits for its answer
        assert child.poll() is None, "finished before it could be interrupted"
        os.kill(child.pid, sig)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the export hung on its stopped file writer")
        assert child.returncode == code
        assert errors.read_bytes() == b"Interrupted\n"
        assert not Path(f"/proc/{worker}").exists(), "the file writer was left behind"
        assert not out.exists() and not list(tmp_path.glob(".out.mnist2db-tmp-*"))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if worker is not None and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)
