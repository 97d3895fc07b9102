"""--resume of a staged run someone changed: what mnist2db reads back from a staging
directory it once wrote (the plan, the staged databases) is checked as a stranger's input.
A real conversion in a child process SIGKILLs itself after committed batches; its staging
directory is then changed (a database put in its place, a link, a cut file, foreign keys,
a plan of other types) and resumed in a child process: a one-line refusal that keeps the
staged run, or the records of an uninterrupted run, never a signal or a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

COUNT = 40
PLAN = "mnist2db-resume.json"


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(11)
    lines = []
    for i in range(COUNT):
        pixels = rng.integers(0, 256, (int(rng.integers(6, 20)), 9, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i:02d}.png")
        lines.append(f"{i:02d}.png {i % 10}\n")
    (root / "list.txt").write_text("".join(lines))
    return root


def convert(photos: Path, out: Path, *, resume: bool = False, kill_after: int = -1,
            backend: str = "lmdb") -> subprocess.CompletedProcess[str]:  # fmt: skip
    """write_imageset in a child, 5 records a batch, SIGKILLed by itself after
    ``kill_after`` committed batches."""
    script = f"""
        import os, signal
        from mnist2db.formats.lists.image_list import ImageList
        from mnist2db.imageset.to_database import write_imageset
        from mnist2db.errors import Mnist2dbError
        listed = list(ImageList({str(photos / "list.txt")!r})())
        batches = [0]
        def progress(done, total):
            batches[0] += 1
            if batches[0] == {kill_after}:
                os.kill(os.getpid(), signal.SIGKILL)
        try:
            result = write_imageset({str(photos) + "/"!r}, lambda: listed, {str(out)!r},
                                    {backend!r}, batch_size=5, jobs=0, resume={resume},
                                    progress=progress, where={str(photos / "list.txt")!r})
        except Mnist2dbError as exc:
            print(exc, file=__import__("sys").stderr)
            raise SystemExit(1)
        print(result.count)
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def records(path: Path) -> list[tuple[bytes, str]]:
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        got = [(bytes(k), hashlib.sha256(v).hexdigest()) for k, v in txn.cursor()]
    env.close()
    return got


def staged(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.mnist2db-tmp-*"))


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def runs(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted records, a staged run killed after 3 batches (15 records), and
    another finished database."""
    base = tmp_path_factory.mktemp("runs")
    whole = convert(photos, base / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = convert(photos, base / "killed", kill_after=3)
    assert killed.returncode == -signal.SIGKILL
    (staging,) = staged(base / "killed")
    other = base / "other"
    env = lmdb.open(str(other), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(15):
            txn.put(b"%08d_%02d.png" % (i, i), b"\x08\x01" * 20)
    env.close()
    return {"whole": records(base / "whole"), "staging": staging, "other": other}


def stage_copy(runs: dict[str, object], out: Path) -> Path:
    """The killed run's staging directory, copied beside ``out`` (its dead process's name
    kept), its plan naming the copy's file as the one it made."""
    source = runs["staging"]
    assert isinstance(source, Path)
    copy = out.parent / source.name.replace(".killed.", f".{out.name}.")
    shutil.copytree(source, copy)
    plan = json.loads((copy / PLAN).read_text())
    if "staged" in plan:  # (a plan that records no identity leaves nothing to rename)
        assert plan["staged"]["states"][-1][0] == 15, plan
        info = os.stat(copy / "data.mdb")
        plan["staged"].update(device=info.st_dev, inode=info.st_ino)
        (copy / PLAN).write_text(json.dumps(plan))
    return copy


def refused(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--resume refused" in lines[0] and "the staged run was kept" in lines[0], lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_copied_staged_run_resumes_to_the_uninterrupted_records(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    stage_copy(runs, out)
    done = convert(photos, out, resume=True)
    assert done.returncode == 0, done.stderr
    assert records(out) == runs["whole"] and staged(out) == []


def test_a_run_resumed_killed_and_resumed_again_is_the_uninterrupted_run(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    assert convert(photos, out, kill_after=2).returncode == -signal.SIGKILL
    assert convert(photos, out, resume=True, kill_after=2).returncode == -signal.SIGKILL
    done = convert(photos, out, resume=True)
    assert done.returncode == 0, done.stderr
    assert records(out) == runs["whole"]


def test_a_staged_database_replaced_by_another_is_refused(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    other = runs["other"]
    assert isinstance(other, Path)
    shutil.copyfile(other / "data.mdb", copy / "data.mdb.new")
    os.replace(copy / "data.mdb.new", copy / "data.mdb")
    refused(convert(photos, out, resume=True), "is another file than the one its plan made")
    assert not out.exists() and staged(out) == [copy] and (copy / PLAN).exists()


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_staged_database_that_is_a_link_is_refused_and_its_target_untouched(
    photos: Path, tmp_path: Path, runs: dict[str, object], link: str
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    target = tmp_path / "someone" / "data.mdb"
    target.parent.mkdir()
    if link == "symbolic":
        other = runs["other"]
        assert isinstance(other, Path)
        shutil.copyfile(other / "data.mdb", target)
        os.unlink(copy / "data.mdb")
        os.symlink(target, copy / "data.mdb")
        expected = "is a symbolic link"
    else:
        os.link(copy / "data.mdb", target)
        expected = "has 2 names (a hard link)"
    before = file_digest(target)
    refused(convert(photos, out, resume=True), f"{copy}/data.mdb {expected}")
    assert file_digest(target) == before and not out.exists()


def test_a_staged_database_cut_short_is_refused_never_sigbus(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    size = os.path.getsize(copy / "data.mdb")
    os.truncate(copy / "data.mdb", size - 4096)
    refused(convert(photos, out, resume=True), f"{copy}/data.mdb: ", "a truncated LMDB database")
    assert os.path.getsize(copy / "data.mdb") == size - 4096


def test_a_staged_database_of_keys_not_caffes_is_refused(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    env = lmdb.open(str(copy), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"zz-not-a-caffe-key", b"\x08\x01")
    env.close()
    refused(convert(photos, out, resume=True), "holds the key b'zz-not-a-caffe-key', not Caffe's")


def test_a_staged_database_with_records_its_plan_does_not_record_is_refused(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    env = lmdb.open(str(copy), map_size=1 << 24)
    with env.begin(write=True) as txn:  # one record more, in place: Caffe's key
        txn.put(b"00000015_15.png", b"\x08\x01")
    env.close()
    refused(convert(photos, out, resume=True), "holds 16 records up to 00000015_15.png, its plan")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("resize", "32", "field 'resize' holds \"32\", not null or [width, height]"),
        ("lines", True, "field 'lines' holds true, not a count of lines"),
        ("staged", {"device": 1}, "field 'staged' holds"),
        ("entries", None, "field 'entries' holds null, not a digest"),
    ],
)
def test_a_plan_of_other_types_is_refused_naming_the_file_and_the_field(
    photos: Path, tmp_path: Path, runs: dict[str, object], field: str, value: object,
    message: str,
) -> None:  # fmt: skip
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    plan = json.loads((copy / PLAN).read_text())
    plan[field] = value
    (copy / PLAN).write_text(json.dumps(plan))
    refused(convert(photos, out, resume=True), f"{copy}/{PLAN}: --resume refused", message)


def test_a_plan_that_is_a_fifo_or_a_link_is_refused_without_blocking(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    os.unlink(copy / PLAN)
    os.mkfifo(copy / PLAN)
    refused(convert(photos, out, resume=True), f"{PLAN}: --resume refused", "not a regular file")
    os.unlink(copy / PLAN)
    os.symlink("/dev/zero", copy / PLAN)
    refused(convert(photos, out, resume=True), f"{PLAN}: --resume refused", "a link?")


def test_the_command_refuses_a_replaced_staged_database_in_one_line(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    other = runs["other"]
    assert isinstance(other, Path)
    os.unlink(copy / "data.mdb")
    shutil.copyfile(other / "data.mdb", copy / "data.mdb")
    done = subprocess.run([sys.executable, "-m", "mnist2db", "imageset", "--list",
                           photos / "list.txt", "--resume", "-j", "1", f"{photos}/", out],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    # Same keys and count (its inode may even be the freed one's): its last value differs.
    refused(done, "holds 15 records up to 00000014_14.png (another last value), its plan")
    assert not out.exists()


def test_the_drop_in_refuses_a_replaced_staged_database_in_one_line(
    photos: Path, tmp_path: Path, runs: dict[str, object]
) -> None:
    out = tmp_path / "db"
    copy = stage_copy(runs, out)
    other = runs["other"]
    assert isinstance(other, Path)
    shutil.copyfile(other / "data.mdb", copy / "new")
    os.replace(copy / "new", copy / "data.mdb")
    drop_in = Path(sys.executable).with_name("convert_imageset")
    done = subprocess.run([drop_in, "--resume", "--jobs=1", f"{photos}/", photos / "list.txt",
                           out], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "--resume refused" in x]
    assert "is another file than the one its plan made" in line
    assert not out.exists() and staged(out) == [copy]


def convert_pair(photos: Path, out: Path, *, resume: bool = False,
                 kill_at_label_batch: int = -1) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """A pair conversion (a list of 2 values a line) in a child, 5 records a batch,
    SIGKILLed by itself once the images are written and ``kill_at_label_batch`` label
    batches committed."""
    listing = photos / "values.txt"
    if not listing.exists():
        listing.write_text("".join(f"{i:02d}.png {i % 10} {i / 8}\n" for i in range(COUNT)))
    script = f"""
        import os, signal, sys
        import mnist2db.labels.databases as labels
        from mnist2db.errors import Mnist2dbError
        from mnist2db.formats.lists.label_table import open_label_table
        from mnist2db.imageset.to_database import write_imageset
        from mnist2db.labels.databases import TargetSource
        source = TargetSource(open_label_table({str(listing)!r}, header=False, width=2))
        encode = labels.encode_target_batch
        made = [0]
        def counted(rows):
            if made[0] == {kill_at_label_batch}:
                os.kill(os.getpid(), signal.SIGKILL)
            made[0] += 1
            return encode(rows)
        labels.encode_target_batch = counted
        try:
            write_imageset({str(photos) + "/"!r}, source.entries, {str(out)!r}, "lmdb",
                           batch_size=5, jobs=0, where={str(listing)!r}, resume={resume},
                           targets=source)
        except Mnist2dbError as exc:
            print(exc, file=sys.stderr)
            raise SystemExit(1)
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_staged_label_database_replaced_by_another_is_refused(
    photos: Path, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    assert convert_pair(photos, whole).returncode == 0
    out = tmp_path / "db"
    assert convert_pair(photos, out, kill_at_label_batch=2).returncode == -signal.SIGKILL
    (label_staging,) = staged(tmp_path / "db_labels")
    held = records(label_staging)
    assert len(held) == 10
    # Another label database of the same keys, other values, put in its place.
    other = tmp_path / "other_labels"
    env = lmdb.open(str(other), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for key, _ in held:
            txn.put(key, b"\x08\x02\x10\x01\x18\x015\x00\x00\x80?5\x00\x00\x00@")
    env.close()
    shutil.copyfile(other / "data.mdb", label_staging / "new")
    os.replace(label_staging / "new", label_staging / "data.mdb")
    refused(convert_pair(photos, out, resume=True), f"{label_staging}: --resume refused",
            "is another file than the one its plan made")  # fmt: skip
    assert not out.exists() and not (tmp_path / "db_labels").exists()
    assert staged(tmp_path / "db_labels") == [label_staging]


def test_a_pair_killed_in_its_labels_resumes_to_the_uninterrupted_pair(
    photos: Path, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    assert convert_pair(photos, whole).returncode == 0
    out = tmp_path / "db"
    assert convert_pair(photos, out, kill_at_label_batch=3).returncode == -signal.SIGKILL
    done = convert_pair(photos, out, resume=True)
    assert done.returncode == 0, done.stderr
    assert records(out) == records(whole)
    assert records(tmp_path / "db_labels") == records(tmp_path / "whole_labels")
