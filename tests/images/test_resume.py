"""--resume: a real conversion in a child process killed with SIGKILL at several points (after
a committed batch, in the middle of one), continued by the same call with resume: the
records equal an uninterrupted run's. A resume whose plan differs is refused in one line; a
run without --resume reports the stale staged run it removes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import numpy as np
import plyvel
import pytest
from PIL import Image

from mnist2db.caffe_tools.convert_imageset import convert_imageset

COUNT = 120


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(3)
    lines = []
    for i in range(COUNT):
        pixels = rng.integers(0, 256, (int(rng.integers(8, 40)), 24, 3), dtype=np.uint8)
        name = f"{i:03d}.{'png' if i % 3 else 'jpg'}"
        Image.fromarray(pixels).save(root / name)
        lines.append(f"{name} {i % 10}\n")
    lines[17] = "missing.png 1\n"  # skipped, before and after a resume
    (root / "list.txt").write_text("".join(lines))
    return root


def digests(path: Path, backend: str) -> dict[bytes, str]:
    if backend == "lmdb":
        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            got = {k: hashlib.sha256(v).hexdigest() for k, v in txn.cursor()}
        env.close()
        return got
    db = plyvel.DB(str(path))
    got = {k: hashlib.sha256(v).hexdigest() for k, v in db}
    db.close()
    return got


def convert(photos: Path, out: Path, backend: str, *, resume: bool, kill_after: int = -1,
            kill_at_skip: bool = False, seed: int | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """write_imageset in a child process, in batches of 10 records, SIGKILLed by itself after
    ``kill_after`` batches were committed, or at the unreadable image (``kill_at_skip``: in
    the middle of a batch)."""
    script = f"""
        import os, signal
        from mnist2db.formats.lists.image_list import ImageList
        from mnist2db.imageset.to_database import write_imageset
        from mnist2db.selection import permutation
        from mnist2db.formats.lists.image_list import ListEntry
        listed = list(ImageList({str(photos / "list.txt")!r})())
        seed = {seed!r}
        if seed is not None:
            order = permutation(seed, len(listed)).tolist()
            listed = [ListEntry(k, listed[i].path, listed[i].label) for k, i in enumerate(order)]
        batches = [0]
        def progress(done, total):
            batches[0] += 1
            if batches[0] == {kill_after}:
                os.kill(os.getpid(), signal.SIGKILL)
        def skipped(gone):
            if {kill_at_skip}:
                os.kill(os.getpid(), signal.SIGKILL)
        result = write_imageset({str(photos) + "/"!r}, lambda: listed, {str(out)!r},
                                {backend!r}, resize=(32, 32), batch_size=10, jobs=2,
                                where={str(photos / "list.txt")!r},
                                resume={resume}, seed=seed, progress=progress,
                                on_skip=skipped)
        print(result.count, len(result.skipped))
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def record_digest(db: Path) -> object:
    return json.loads((db / "mnist2db.json").read_text())["digest"]


def staged(out: Path) -> list[str]:
    return [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.mnist2db-tmp-")]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_killed_runs_resume_to_the_uninterrupted_records(
    photos: Path, tmp_path: Path, backend: str
) -> None:
    whole = convert(photos, tmp_path / "whole", backend, resume=False)
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.split() == [str(COUNT - 1), "1"]
    expected = digests(tmp_path / "whole", backend)
    for n, kill_after in enumerate([1, 4, 9] if backend == "lmdb" else [3]):
        out = tmp_path / f"db{n}"
        killed = convert(photos, out, backend, resume=False, kill_after=kill_after)
        assert killed.returncode == -signal.SIGKILL and not out.exists()
        assert len(staged(out)) == 1
        done = convert(photos, out, backend, resume=True)
        assert done.returncode == 0, done.stderr
        assert digests(out, backend) == expected
        assert staged(out) == [] and "mnist2db-resume.json" not in os.listdir(out)
        # The records' digest continued from the state saved at the commit: the whole run's.
        assert record_digest(out) == record_digest(tmp_path / "whole")
        assert [n for n in os.listdir(out) if n.startswith("mnist2db")] == ["mnist2db.json"]


def test_a_kill_in_the_middle_of_a_batch_and_a_shuffle(photos: Path, tmp_path: Path) -> None:
    whole = convert(photos, tmp_path / "whole", "lmdb", resume=False, seed=5)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", resume=False, seed=5, kill_at_skip=True)
    assert killed.returncode == -signal.SIGKILL and len(staged(out)) == 1
    done = convert(photos, out, "lmdb", resume=True, seed=5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(COUNT - 1), "1"]  # the unreadable one redone: named
    assert digests(out, "lmdb") == digests(tmp_path / "whole", "lmdb")


def test_a_resume_of_other_options_is_refused_naming_them(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", resume=False, kill_after=2)
    assert killed.returncode == -signal.SIGKILL
    args = [str(photos) + "/", str(photos / "list.txt"), str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db.caffe_tools.convert_imageset", "--resume",
         "--resize_width=32", "--resize_height=16", *args],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].endswith(
        f"{out}: --resume refused: the resize is 32 × 16, the staged run's 32 × 32; run "
        "without --resume to start again"
    )
    assert len(staged(out)) == 1
    # Without --resume: the staged run is reported, removed, and the conversion done anew.
    code = convert_imageset(["--resize_width=32", "--resize_height=32", *args])
    assert code == 0
    assert staged(out) == []


def test_resume_with_nothing_staged_is_refused(photos: Path, tmp_path: Path) -> None:
    args = [str(photos) + "/", str(photos / "list.txt"), str(tmp_path / "db")]
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db.caffe_tools.convert_imageset", "--resume", *args],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--resume: no staged run of it to continue" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "db").exists()


def test_mnist2db_imageset_resumes_too(photos: Path, tmp_path: Path) -> None:
    whole = convert(photos, tmp_path / "whole", "lmdb", resume=False)
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", resume=False, kill_after=3)
    assert whole.returncode == 0 and killed.returncode == -signal.SIGKILL
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db", "imageset", "--list", str(photos / "list.txt"),
         "--resize", "32x32", "--resume", str(photos), str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert digests(out, "lmdb") == digests(tmp_path / "whole", "lmdb")


def test_an_image_changed_since_the_kill_is_refused_naming_it(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "db"
    changed = tmp_path / "photos"
    import shutil

    shutil.copytree(photos, changed)
    killed = convert(changed, out, "lmdb", resume=False, kill_after=4)
    assert killed.returncode == -signal.SIGKILL and len(staged(out)) == 1
    image = changed / "004.png"  # in the first batch, committed
    Image.fromarray(np.zeros((9, 24, 3), np.uint8)).save(image)
    os.utime(image, ns=(1, 1))
    done = convert(changed, out, "lmdb", resume=True)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].endswith(
        f"{image}: --resume refused: the image changed since the staged run read it (its "
        f"record is committed in the staged run of {out}); run without --resume to start again"
    )
    assert len(staged(out)) == 1 and not out.exists()  # the staged run kept
    image.unlink()
    gone = convert(changed, out, "lmdb", resume=True)
    assert gone.returncode == 1 and "the image is gone" in gone.stderr.splitlines()[-1]
