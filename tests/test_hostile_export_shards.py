"""export --to webdataset against a hostile or careless user: a manifest read back is a
stranger's input (every field checked, every name confined to OUT-NNNNNN.tar), a resume
proves its source is the one its shards came from, no shard name is written over a file or
link mnist2db did not write, and a stopped PNG worker never holds up an interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import fashion_file

from mnist2db import convert
from mnist2db.cli.app import cli


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def fashion_db(path: Path, count: int, *, offset: int = 0, **options: object) -> Path:
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), path,
            count=count, offset=offset, **options)  # fmt: skip
    return path


def snapshot(folder: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``folder`` (links not followed): its kind and its bytes or target."""
    found: dict[str, tuple[str, bytes | str]] = {}
    for place, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(place, name)
            if path.is_symlink():
                found[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                found[str(path)] = ("file", path.read_bytes())
            elif path.is_dir():
                found[str(path)] = ("dir", "")
    return found


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    """A database of 7 records and its complete export in 4 shards: (db, OUT)."""
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    result = run("export", "--to", "webdataset", "--shard-size", 2, db, out)
    assert result.exit_code == 0, result.output
    return db, out


def edit_manifest(out: Path, **fields: object) -> Path:
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))
    return path


def one_line_refusal(result, *parts: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    for part in parts:
        assert part in result.stderr, result.stderr


# -- a manifest's names: confined to OUT-NNNNNN.tar --------------------------------------------


def test_replacing_names_outside_the_shards_folder_are_refused(exported, tmp_path: Path) -> None:
    db, out = exported
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    path = edit_manifest(out, replacing=["../victim.txt"])
    before = snapshot(tmp_path)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--overwrite", db, out)
    one_line_refusal(result, f'{path}: replacing[0]: "../victim.txt" is not a shard name of s')
    assert snapshot(tmp_path) == before
    assert victim.read_text() == "mine"


def test_replacing_as_a_string_is_refused_not_iterated(exported) -> None:
    db, out = exported
    for name in "ab":
        (out.parent / name).write_text(f"the user's {name}")
    path = edit_manifest(out, replacing="ab")
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--overwrite", db, out)
    one_line_refusal(result, f'{path}: replacing: "ab", expected a list of strings')
    assert snapshot(out.parent) == before


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"shards": [1]}, "shards[0]: not an object"),
        ({"shards": {}}, "shards: {}, expected a list"),
        ({"records": float("inf")}, "records: float, expected a whole number"),
        ({"records": 10**30}, "records: 1000000000000000000000000000000, expected a whole"),
        ({"records": True}, "records: true, expected a whole number"),
        ({"complete": "yes"}, 'complete: "yes", expected true or false'),
        ({"version": 2}, "version: 2, expected a whole number 1..1"),
    ],
)
@pytest.mark.parametrize("mode", ["--overwrite", "--resume"])
def test_hand_edited_fields_are_refused_in_one_line(exported, fields, says, mode) -> None:
    db, out = exported
    path = edit_manifest(out, **fields)
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, mode, db, out)
    one_line_refusal(result, f"{path}: {says}", "not a manifest as mnist2db writes it")
    assert snapshot(out.parent) == before


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m["shards"][1].update(last_key_hex="zz"), 'shards[1].last_key_hex: "zz"'),
        (lambda m: m["shards"][0].update(name="../s-000000.tar"), "shards[0].name"),
        (lambda m: m["shards"][0].update(name="s-000001.tar"), "shards[0].name"),
        (
            lambda m: m["shards"][2].update(records=3),
            "shards[2].records: 3, expected a whole number 1..2",
        ),
        (lambda m: m["shards"][1].update(first_key_hex="00"), "shards[1]: its keys are not after"),
        (lambda m: m["shards"][0].pop("sha256"), "shards[0].sha256: missing"),
    ],
)
def test_hand_edited_shard_entries_are_refused(exported, edit, says) -> None:
    db, out = exported
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--overwrite", db, out)
    one_line_refusal(result, f"{path}: {says}")
    assert snapshot(out.parent) == before


# -- a resume: the source proved to be the one the shards came from ----------------------------


def _killed_export(db: Path, out: Path, listed: int) -> None:
    """The state a SIGKILL leaves: a manifest listing ``listed`` shards, not complete."""
    assert run("export", "--to", "webdataset", "--shard-size", 2, db, out).exit_code == 0
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    for entry in manifest["shards"][listed:]:
        (out.parent / entry["name"]).unlink()
    manifest["shards"] = manifest["shards"][:listed]
    manifest["complete"] = False
    manifest["records"] = manifest["source_state"]["records"]
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def test_resume_after_the_source_was_converted_again_is_refused(tmp_path: Path) -> None:
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    # Converted again: the same count and keys, other images (items 100-106).
    fashion_db(db, 7, offset=100, overwrite=True)
    before = snapshot(tmp_path / "shards")
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    one_line_refusal(result, f"{out}.shards.json: its source had digest ", "converted again since?")
    assert snapshot(tmp_path / "shards") == before


def test_resume_of_an_unchanged_source_finishes_it(tmp_path: Path) -> None:
    db = fashion_db(tmp_path / "db", 7)
    whole = tmp_path / "whole" / "s"
    assert run("export", "--to", "webdataset", "--shard-size", 2, db, whole).exit_code == 0
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    assert result.exit_code == 0, result.output
    assert snapshot(out.parent) == {
        str(out.parent / Path(k).name): v for k, v in snapshot(whole.parent).items()
    }


def test_resume_of_a_manifest_without_the_source_state_is_refused(tmp_path: Path) -> None:
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    del manifest["source_state"]
    path.write_text(json.dumps(manifest))
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    one_line_refusal(result, f"{path}: records no state of its source")
    assert snapshot(out.parent) == before


@pytest.mark.parametrize("index", [1, 2])
@pytest.mark.parametrize("kind", ["file", "link"])
def test_resume_never_writes_over_a_users_file_at_a_shard_name(tmp_path: Path, index, kind) -> None:
    """Shard 1 is the one after the last listed (a killed export's may be there: proved ours
    by its first member), shard 2 one the manifest never named."""
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    target = out.parent / f"s-00000{index}.tar"
    mine = tmp_path / "mine.tar"
    mine.write_bytes(b"the user's tar")
    if kind == "link":
        target.symlink_to(mine)
    else:
        target.write_bytes(b"the user's tar")
    before = snapshot(tmp_path)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    one_line_refusal(result, str(target))
    assert snapshot(tmp_path) == before


def test_resume_replaces_the_pending_shard_of_the_killed_export(tmp_path: Path) -> None:
    """The shard placed before the manifest listed it (a kill between the two) is ours: its
    first member is the next record's, as mnist2db writes members."""
    db = fashion_db(tmp_path / "db", 7)
    whole = tmp_path / "whole" / "s"
    assert run("export", "--to", "webdataset", "--shard-size", 2, db, whole).exit_code == 0
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    (out.parent / "s-000001.tar").write_bytes((whole.parent / "s-000001.tar").read_bytes())
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    assert result.exit_code == 0, result.output
    assert Path(f"{out}.shards.json").read_bytes() == Path(f"{whole}.shards.json").read_bytes()


# -- --overwrite: every shard name checked ---------------------------------------------------


@pytest.mark.parametrize("index", [0, 1, 3])
def test_overwrite_refuses_a_link_at_any_shard_name(exported, tmp_path: Path, index) -> None:
    db, out = exported
    target = out.parent / f"s-00000{index}.tar"
    kept = tmp_path / "kept.tar"
    kept.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(kept)
    before = snapshot(tmp_path)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--overwrite", db, out)
    one_line_refusal(result, str(target))
    assert snapshot(tmp_path) == before


def test_a_file_appearing_at_a_shard_name_is_not_replaced(tmp_path: Path, monkeypatch) -> None:
    """A user's file created at the next shard's name while the shard is written: the
    commit refuses it (never renamed over), the export fails in one line."""
    from mnist2db.exporting.webdataset import shard_writer

    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    planted = out.parent / "s-000002.tar"
    real = shard_writer.ShardFile.__init__

    def plant(self, path, *args):
        real(self, path, *args)
        if path == str(planted):
            planted.write_bytes(b"the user's")

    monkeypatch.setattr(shard_writer.ShardFile, "__init__", plant)
    result = run("export", "--to", "webdataset", "--shard-size", 2, db, out)
    one_line_refusal(result, f"{planted}: appeared while exporting")
    assert planted.read_bytes() == b"the user's"
    assert not [p for p in out.parent.iterdir() if ".mnist2db-tmp-" in p.name]


# -- a stopped PNG worker and an interruption -------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(t) for t in text]
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the PNG worker needs two CPUs")
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_png_worker_never_holds_up_an_interruption(tmp_path: Path, sig, code) -> None:
    db = fashion_db(tmp_path / "db", 10000)  # raw grey records: a PNG worker is forked
    out = tmp_path / "shards" / "s"
    errors = tmp_path / "stderr"
    with errors.open("wb") as stream:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mnist2db",
                "export",
                "--to",
                "webdataset",
                "--quiet",
                str(db),
                str(out),
            ],
            stderr=stream,  # fmt: skip
        )
    worker = None
    try:
        deadline = time.monotonic() + 60
        while worker is None and child.poll() is None and time.monotonic() < deadline:
            workers = _children(child.pid)
            worker = workers[0] if workers else None
        assert worker is not None, "no PNG worker was forked"
        os.kill(worker, signal.SIGSTOP)
        time.sleep(0.5)  # the export now waits for the worker's answer
        assert child.poll() is None, "finished before it could be interrupted"
        os.kill(child.pid, sig)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the export hung on its stopped PNG worker")
        assert child.returncode == code
        assert errors.read_bytes() == b"Interrupted\n"
        assert not Path(f"/proc/{worker}").exists(), "the PNG worker was left behind"
        assert [p.name for p in out.parent.iterdir()] in ([], ["s.shards.json"])
        assert not list(tmp_path.rglob("*.mnist2db-tmp-*"))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if worker is not None and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)


def test_shards_never_go_through_a_link_put_in_place_of_their_folder(tmp_path: Path,
                                                                     monkeypatch) -> None:  # fmt: skip
    """The folder the export made for the shards, moved away and replaced by a link to
    another folder between two shards: the next shard is refused, nothing lands there."""
    from mnist2db.exporting.webdataset import shards

    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "new" / "s"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = shards.shard_name

    def swap_before_shard_2(prefix: str, index: int) -> str:
        if index == 2:
            deadline = time.monotonic() + 30
            while not Path(real(prefix, 1)).exists() and time.monotonic() < deadline:
                time.sleep(0.01)  # shard 1 committed (on its thread)
            out.parent.rename(tmp_path / "moved")
            out.parent.symlink_to(elsewhere)
        return real(prefix, index)

    monkeypatch.setattr(shards, "shard_name", swap_before_shard_2)
    result = run("export", "--to", "webdataset", "--shard-size", 2, db, out)
    one_line_refusal(result, f"{out.parent}: cannot write: no longer the folder it was")
    assert list(elsewhere.iterdir()) == []


def test_a_shard_entry_edited_to_agree_with_the_source_but_not_its_shard_is_refused(
    tmp_path: Path,
) -> None:
    """Shard 0 holds records 0 and 1; its entry edited to list record 0 alone (keys and
    count the source agrees with, the shard's SHA-256 unchanged): resuming from it would
    export record 1 twice. The shard's own members are read with its SHA-256: refused."""
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 1)
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    entry = manifest["shards"][0]
    entry["records"], entry["last_key_hex"] = 1, entry["first_key_hex"]
    path.write_text(json.dumps(manifest))
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    one_line_refusal(result, "s-000000.tar holds 2 samples, from '00000000' to '00000001'")
    assert snapshot(out.parent) == before


def test_an_earlier_shard_entry_edited_to_agree_with_the_source_is_refused(tmp_path) -> None:
    """Shards 0 and 1 listed; shard 0's entry says 1 record (to key 0) and shard 1's says
    it begins at key 1: refused (by the walk of the source's keys: shard 1 would end at key
    2, not 3), nothing touched."""
    db = fashion_db(tmp_path / "db", 7)
    out = tmp_path / "shards" / "s"
    _killed_export(db, out, 2)
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    zero, one = manifest["shards"]
    zero["records"], zero["last_key_hex"] = 1, zero["first_key_hex"]
    one["first_key_hex"] = b"00000001".hex()
    path.write_text(json.dumps(manifest))
    before = snapshot(out.parent)
    result = run("export", "--to", "webdataset", "--shard-size", 2, "--resume", db, out)
    one_line_refusal(
        result, "shards[1] lists 2 records from key 3030303030303031 to 3030303030303033"
    )
    assert snapshot(out.parent) == before


def test_a_middle_shard_entry_shifted_to_agree_with_the_source_is_refused(tmp_path) -> None:
    """Shards of 2 samples (--shard-bytes) where 3 are allowed (--shard-size): shard 0's
    entry edited to hold record 0 alone and shard 1's records 1-3, as the source agrees;
    shard 1's first member (record 2's) says otherwise: refused, nothing touched."""
    from db_helpers import write_raw_db

    from mnist2db.datum_pb2 import Datum

    def encoded(label: int) -> bytes:
        datum = Datum()
        datum.channels, datum.height, datum.width = 1, 2, 2
        datum.data, datum.encoded, datum.label = b"\x89PNG" + bytes(60), True, label
        return datum.SerializeToString()

    db = write_raw_db(tmp_path / "db", "lmdb", {b"%08d" % i: encoded(i) for i in range(7)})
    out = tmp_path / "shards" / "s"
    args = ["export", "--to", "webdataset", "--shard-size", 3, "--shard-bytes", 4096, db, out]
    assert run(*args).exit_code == 0
    path = Path(f"{out}.shards.json")
    manifest = json.loads(path.read_text())
    assert [e["records"] for e in manifest["shards"]] == [2, 2, 2, 1]
    (out.parent / "s-000003.tar").unlink()
    manifest["shards"], manifest["complete"] = manifest["shards"][:3], False
    zero, one, _ = manifest["shards"]
    zero["records"], zero["last_key_hex"] = 1, zero["first_key_hex"]
    one["records"], one["first_key_hex"] = 3, b"00000001".hex()
    path.write_text(json.dumps(manifest))
    before = snapshot(out.parent)
    result = run(*args[:-2], "--resume", db, out)
    one_line_refusal(result, "s-000001.tar does not begin with the sample of its first key")
    assert snapshot(out.parent) == before
