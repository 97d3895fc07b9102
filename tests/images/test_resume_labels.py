"""--resume for an image database and its label database: a real pair conversion in a child
process, SIGKILLed at several points (after image batches; after the images, before or
between the label batches; once both are written; while the two are placed), continued
with resume. Both staged databases keep their committed batches (the resumed child counts
the batches it writes), and the pair equals an uninterrupted run's, key for key and byte
for byte, its records' digests verified. A plan whose label source differs is refused in
one line."""

from __future__ import annotations

import hashlib
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

from mnist2db import verify_db, verify_label_db

COUNT = 60
BATCH = 5
RECORDS = COUNT - 1  # one image is missing


def values_of(i: int) -> list[float]:
    return [float(i % 4), i / 8 - 2.0, -0.25 * i]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """COUNT small images (names with a space), listed with three values each, one of
    them missing (skipped, before and after a resume)."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(28)
    lines = []
    for i in range(COUNT):
        pixels = rng.integers(0, 256, (int(rng.integers(6, 20)), 12, 3), dtype=np.uint8)
        name = f"img {i:02d}.png"
        if i != 23:
            Image.fromarray(pixels).save(root / name)
        lines.append(f"{name} " + " ".join(repr(v) for v in values_of(i)) + "\n")
    (root / "values.txt").write_text("".join(lines))
    return root


def digests(path: Path, backend: str) -> list[tuple[bytes, str]]:
    """The records, in key order (the key and a digest of the value)."""
    if backend == "lmdb":
        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            got = [(bytes(k), hashlib.sha256(v).hexdigest()) for k, v in txn.cursor()]
        env.close()
        return got
    db = plyvel.DB(str(path))
    got = [(k, hashlib.sha256(v).hexdigest()) for k, v in db]
    db.close()
    return got


def convert(photos: Path, out: Path, backend: str, *, resume: bool = False, jobs: int = 2,
            seed: int | None = None, kill: tuple[str, int] = ("", -1),
            listing: str = "values.txt", caffe_order: bool = False, alone: bool = False,
            header: bool = False,
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """A pair conversion in a child process, in batches of BATCH records; ``kill``:
    ``("images", n)`` SIGKILLs it once n image batches are committed, ``("labels", n)``
    once the images are all written and n label batches committed, ``("done", 0)`` once
    both are written (the plan not yet removed), ``("placing", 0)`` once
    the image database is placed and the label database not yet; ``caffe_order``: the
    drop-in's shuffle, not mnist2db's; ``alone``: the same images without their label
    database. It prints its records, and the image and label
    batches it wrote."""
    script = f"""
        import os, signal
        import mnist2db.labels.databases as labels
        import mnist2db.storage.files as staging
        from mnist2db.formats.lists.label_table import open_label_table
        from mnist2db.imageset.to_database import write_imageset
        from mnist2db.labels.databases import TargetSource
        from mnist2db.selection import permutation
        kind, after = {kill!r}
        table = open_label_table({str(photos / listing)!r}, header={header},
                                 width=None if {header} else 3)
        seed = {seed!r}
        order = None if seed is None else permutation(seed, TargetSource(table).count())
        if {caffe_order} and seed is not None:
            import numpy as np
            raw = np.random.PCG64(seed).random_raw(TargetSource(table).count())
            order = np.argsort(raw, kind="stable")
        source = TargetSource(table, order)
        batches = {{"images": 0, "labels": 0}}
        def progress(done, total):
            batches["images"] += 1
            if kind == "images" and batches["images"] == after:
                os.kill(os.getpid(), signal.SIGKILL)
        encode = labels.encode_target_batch
        def counted(rows):
            if kind == "labels" and batches["labels"] == after:
                os.kill(os.getpid(), signal.SIGKILL)
            batches["labels"] += 1
            return encode(rows)
        labels.encode_target_batch = counted
        def checkpoint(stage, path):
            if kind == "placing" and stage == "databases-first":
                os.kill(os.getpid(), signal.SIGKILL)
        staging.checkpoint = checkpoint
        import mnist2db.imageset.to_database as imageset
        remove_plan = imageset.remove_plan
        def finished(path):
            if kind == "done":
                os.kill(os.getpid(), signal.SIGKILL)
            remove_plan(path)
        imageset.remove_plan = finished
        result = write_imageset({str(photos) + "/"!r}, source.entries, {str(out)!r},
                                {backend!r}, batch_size={BATCH}, jobs={jobs},
                                where={str(photos / listing)!r}, resume={resume},
                                seed=seed, progress=progress,
                                targets=None if {alone} else source)
        print(result.count, result.labels and result.labels.count, batches["images"],
              batches["labels"])
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def staged(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out.parent) if ".mnist2db-" in n and out.name in n)


def labels_of(out: Path) -> Path:
    return Path(f"{out}_labels")


def batches_of(records: int) -> int:
    return -(-records // BATCH)


@pytest.mark.parametrize(
    ("backend", "jobs", "seed"),
    [("lmdb", 2, None), ("lmdb", 1, 5), ("leveldb", 2, 5), ("leveldb", 1, None)],
)
def test_killed_pairs_resume_to_the_uninterrupted_pair(
    photos: Path, tmp_path: Path, backend: str, jobs: int, seed: int | None
) -> None:
    whole = convert(photos, tmp_path / "whole", backend, jobs=jobs, seed=seed)
    assert whole.returncode == 0, whole.stderr
    every = batches_of(RECORDS)
    assert whole.stdout.split() == [str(RECORDS), str(RECORDS), str(every), str(every)]
    images, labels = (
        digests(tmp_path / "whole", backend),
        digests(labels_of(tmp_path / "whole"), backend),
    )
    assert [k for k, _ in images] == [k for k, _ in labels] and len(images) == RECORDS
    # (where it is killed, image batches left to write, label batches left to write)
    points = [(("images", 1), every - 1, every), (("images", 7), every - 7, every),
              (("labels", 0), 0, every), (("labels", 3), 0, every - 3),
              (("labels", every - 1), 0, 1), (("done", 0), 0, 0)]  # fmt: skip
    if (backend, jobs) != ("lmdb", 2):  # one in each phase, and between the two
        points = points[1:4]
    for n, (kill, image_batches, label_batches) in enumerate(points):
        out = tmp_path / f"db{n}"
        killed = convert(photos, out, backend, jobs=jobs, seed=seed, kill=kill)
        assert killed.returncode == -signal.SIGKILL, (kill, killed.stderr)
        assert not out.exists() and not labels_of(out).exists()
        assert len(staged(out)) == 2  # the image and the label staging directories
        done = convert(photos, out, backend, resume=True, jobs=jobs, seed=seed)
        assert done.returncode == 0, (kill, done.stderr)
        assert done.stdout.split() == [str(RECORDS), str(RECORDS), str(image_batches),
                                       str(label_batches)], kill  # fmt: skip
        assert digests(out, backend) == images, kill
        assert digests(labels_of(out), backend) == labels, kill
        assert staged(out) == [] and "mnist2db-resume.json" not in os.listdir(out)
        assert verify_db(out).count == verify_db(labels_of(out)).count == RECORDS
        assert verify_label_db(out, labels_of(out)).count == RECORDS


def test_a_kill_while_the_pair_is_placed_leaves_neither(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", seed=5, kill=("placing", 0))
    assert killed.returncode == -signal.SIGKILL
    assert out.exists() and not labels_of(out).exists()  # half placed: a journal beside
    # The staged run was complete (its plan removed): nothing to resume; the next writer
    # rolls the half back first.
    again = convert(photos, out, "lmdb", resume=True, seed=5)
    assert again.returncode == 1
    assert "--resume: no staged run of it to continue" in again.stderr.splitlines()[-1]
    done = convert(photos, out, "lmdb", seed=5)
    assert done.returncode == 0, done.stderr
    whole = convert(photos, tmp_path / "whole", "lmdb", seed=5)
    assert whole.returncode == 0
    assert digests(out, "lmdb") == digests(tmp_path / "whole", "lmdb")
    assert digests(labels_of(out), "lmdb") == digests(labels_of(tmp_path / "whole"), "lmdb")
    assert staged(out) == []


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mnist2db", *map(str, args)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_mnist2db_imageset_and_the_drop_in_resume_a_pair(photos: Path, tmp_path: Path) -> None:
    listing = photos / "values.txt"
    whole = tmp_path / "whole"
    made = cli("imageset", "--list", listing, "--values", 3, "--shuffle", "--seed", 5,
               photos, whole)  # fmt: skip
    assert made.returncode == 0, made.stderr
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", seed=5, kill=("labels", 2))
    assert killed.returncode == -signal.SIGKILL
    # The staged run's seed is taken (none given).
    done = cli("imageset", "--list", listing, "--values", 3, "--shuffle", "--resume",
               photos, out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert digests(out, "lmdb") == digests(whole, "lmdb")
    assert digests(labels_of(out), "lmdb") == digests(labels_of(whole), "lmdb")

    drop = tmp_path / "drop"
    killed = convert(photos, drop, "leveldb", seed=5, kill=("images", 4), caffe_order=True)
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(
        [sys.executable, "-m", "mnist2db.caffe_tools.convert_imageset", "--resume",
         "--shuffle", "--backend=leveldb", "--targets=list", "--targets_width=3",
         f"{photos}/", str(listing), str(drop)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    # The drop-in's shuffle is Caffe's order: compare it with an uninterrupted drop-in run.
    fresh = subprocess.run(
        [sys.executable, "-m", "mnist2db.caffe_tools.convert_imageset", "--shuffle",
         "--seed=5", "--backend=leveldb", "--targets=list", "--targets_width=3",
         f"{photos}/", str(listing), str(tmp_path / "fresh")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert digests(drop, "leveldb") == digests(tmp_path / "fresh", "leveldb")
    assert digests(labels_of(drop), "leveldb") == digests(labels_of(tmp_path / "fresh"), "leveldb")


def test_a_resume_whose_label_source_differs_is_refused(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "db"
    killed = convert(photos, out, "lmdb", kill=("images", 3))
    assert killed.returncode == -signal.SIGKILL
    # One value changed (not the first, so the images and their labels are the same).
    lines = (photos / "values.txt").read_text().splitlines(keepends=True)
    lines[40] = lines[40].replace(repr(values_of(40)[2]), "7.5")
    (photos / "changed.txt").write_text("".join(lines))
    where = photos / "changed.txt"
    changed = convert(photos, out, "lmdb", resume=True, listing="changed.txt")
    assert changed.returncode == 1
    assert changed.stderr.splitlines()[-1].endswith(
        f"{out}: --resume refused: the list is {where}, the staged run's "
        f"{photos / 'values.txt'}; run without --resume to start again"
    )
    (photos / "changed.txt").unlink()
    (photos / "values.txt.orig").write_text((photos / "values.txt").read_text())
    try:
        (photos / "values.txt").write_text("".join(lines))
        changed = convert(photos, out, "lmdb", resume=True)
    finally:
        os.replace(photos / "values.txt.orig", photos / "values.txt")
    assert changed.returncode == 1
    assert changed.stderr.splitlines()[-1].endswith(
        f"{out}: --resume refused: the label values differ from the staged run's (the label "
        "file changed); run without --resume to start again"
    )
    # The image database alone, where the staged run wrote a label database beside.
    alone = convert(photos, out, "lmdb", resume=True, alone=True)
    assert alone.returncode == 1
    assert alone.stderr.splitlines()[-1].endswith(
        f"{out}: --resume refused: the label values were written by the staged run (a label "
        "database beside: give --labels or --values again); run without --resume to start "
        "again"
    )
    assert len(staged(out)) == 2  # nothing lost by a refusal
    done = convert(photos, out, "lmdb", resume=True)
    assert done.returncode == 0, done.stderr
    # A label database asked of a staged run that wrote the images alone.
    killed = convert(photos, tmp_path / "alone", "lmdb", kill=("images", 3), alone=True)
    assert killed.returncode == -signal.SIGKILL
    more = convert(photos, tmp_path / "alone", "lmdb", resume=True)
    assert more.returncode == 1
    assert more.stderr.splitlines()[-1].endswith(
        f"{tmp_path / 'alone'}: --resume refused: the label values were not written by the "
        "staged run (it made no label database); run without --resume to start again"
    )


def test_a_csv_table_resumes_from_the_command_line(photos: Path, tmp_path: Path) -> None:
    rows = ["path,a,b,c\n"] + [
        f"img {i:02d}.png," + ",".join(repr(v) for v in values_of(i)) + "\n" for i in range(COUNT)
    ]
    (photos / "table.csv").write_text("".join(rows))
    table = photos / "table.csv"
    whole = tmp_path / "whole"
    made = cli("imageset", "--labels", table, "--backend", "leveldb", photos, whole)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "db"
    killed = convert(photos, out, "leveldb", kill=("labels", 1), listing="table.csv",
                     header=True)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    done = cli("imageset", "--labels", table, "--backend", "leveldb", "--resume", photos, out)
    assert done.returncode == 0, done.stderr
    assert digests(out, "leveldb") == digests(whole, "leveldb")
    assert digests(labels_of(out), "leveldb") == digests(labels_of(whole), "leveldb")
    assert len(digests(out, "leveldb")) == RECORDS and staged(out) == []
