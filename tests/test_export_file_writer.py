"""export --to files' second process (mnist2db.exporting.image_files.file_writer): the files it creates
are the ones the export alone creates, name for name and byte for byte, whatever the order
of batches it places and batches the export places itself; a full disk in it, or its
death, ends the export in one line and leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from db_helpers import write_raw_db
from helpers import fashion_file

from mnist2db import array_to_datum, convert, export_files

CORPUS = Path(__file__).parent / "data" / "export"
two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the writing process starts only with 2 CPUs"
)


def _encoded(data: bytes, label: int) -> bytes:
    datum = array_to_datum(np.zeros((1, 1, 1), np.uint8), label)
    datum.ClearField("channels"), datum.ClearField("height"), datum.ClearField("width")
    datum.data, datum.encoded = data, True
    return datum.SerializeToString()


def _export(db: Path, out: Path, *, cpus: int | None = None) -> subprocess.CompletedProcess[str]:
    """``mnist2db export --to files DB OUT`` in a process of its own, on ``cpus`` CPUs (1: the
    export places every file itself)."""

    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])

    return subprocess.run([sys.executable, "-m", "mnist2db", "export", "--to", "files", "--quiet",
                           str(db), str(out)], capture_output=True, text=True,
                          preexec_fn=pin)  # fmt: skip


def _tree(out: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(out)): path.read_bytes() for path in out.rglob("*") if path.is_file()
    }


def _children(pid: int) -> list[int]:
    """The processes ``pid``'s threads forked (a thread, or ``pid``, may end meanwhile)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # ended
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as stream:
                found += [int(child) for child in stream.read().split()]
        except FileNotFoundError:
            continue
    return found


@two_cpus
def test_the_same_tree_with_and_without_the_writing_process(tmp_path: Path) -> None:
    """2600 records in 3 batches and more: raw grey ones, small PNGs, large JPEG-signed ones
    (> 16 KiB: batches the export places itself, between the process's), Caffe keys naming
    one path twice (equal bytes: shared; other bytes: a name of its own), a path taken by a
    directory, gaps in the keys' numbers, keys to map. The tree (every file, list.txt,
    renamed.tsv, export.json) is the same on 2 CPUs (the process) and on 1 (none)."""
    rng = np.random.default_rng(4)
    png = (CORPUS / "images" / "cat" / "grey.png").read_bytes()
    records: dict[bytes, bytes] = {}
    n = 0  # the Caffe keys' numbers, in key order; a gap of 2 after each unsafe key
    for i in range(2600):
        kind = i % 13
        if 1200 <= i < 1300:  # a batch of large files
            data = b"\xff\xd8\xff" + rng.integers(0, 256, 20000 + i, dtype=np.uint8).tobytes()
            records[b"%08d_big/%d.jpg" % (n, i % 7)] = _encoded(data, i % 3)
        elif kind == 0:
            records[b"%08d_same.png" % n] = _encoded(png, 1)  # shared after the first
        elif kind == 1:
            records[b"%08d_same.png" % n] = _encoded(png + b"%d" % (i % 2), 2)  # mapped
        elif kind == 2:
            records[b"%08d_d/x/y.png" % n] = _encoded(png, 3)
        elif kind == 3:
            records[b"%08d_d/x" % n] = _encoded(png, 4)  # a directory there: mapped
        elif kind == 4:
            records[b"%08d_../up.png" % n] = _encoded(png, 5)  # unsafe: mapped
            n += 2
        else:  # after every Caffe key
            pixels = rng.integers(0, 256, (1, 5, 4), dtype=np.uint8)
            records[b"raw%06d" % i] = array_to_datum(pixels, i % 10).SerializeToString()
        n += 1
    db = write_raw_db(tmp_path / "db", "lmdb", records)
    both = []
    for cpus in (None, 1):
        out = tmp_path / f"files-{cpus}"
        done = _export(db, out, cpus=cpus)
        assert done.returncode == 0, done.stderr
        both.append(_tree(out))
    assert both[0] == both[1]
    listed = both[0]["list.txt"].decode().splitlines()
    assert len(listed) > 2600 and any(line.startswith(".skipped/") for line in listed)
    assert "same.png 1" in listed and b"same.png" in both[0]["renamed.tsv"]

    # And the process did place them: it is there while the export lists its files.
    children: list[int] = []
    export_files(db, tmp_path / "in-process",
                 progress=lambda done, total: children.extend(_children(os.getpid())))  # fmt: skip
    assert children, "no process placed the files"
    assert _tree(tmp_path / "in-process") == both[0]


@pytest.mark.parametrize("cpus", [None, 1])
def test_full_disk_of_raw_records_leaves_nothing(tmp_path: Path, cpus: int | None) -> None:
    """Raw records to PNGs on a full tmpfs: the export (its process, or itself on 1 CPU) ends
    in the one line that names the file it could not write, and leaves nothing."""
    from os_helpers import mounted_tmpfs

    db = tmp_path / "fashion_lmdb"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db,
            count=3000)  # fmt: skip
    with mounted_tmpfs(tmp_path / "small", "300k") as mount:
        done = _export(db, mount / "files", cpus=cpus)
        assert done.returncode == 1
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"Error: {mount}/files/")
        assert lines[0].endswith(".png: cannot write: No space left on device")
        assert os.listdir(mount) == []


@two_cpus
def test_a_killed_writing_process_ends_the_export_and_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fashion_lmdb"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db)
    out = tmp_path / "files"
    export = subprocess.Popen([sys.executable, "-m", "mnist2db", "export", "--to", "files",
                               "--quiet", str(db), str(out)], stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    killed = None
    try:
        deadline = time.monotonic() + 60
        while killed is None and export.poll() is None and time.monotonic() < deadline:
            staged = [p for p in tmp_path.iterdir() if p.name.startswith(".files.")]
            writers = _children(export.pid)
            if writers and staged and any(p.rglob("*.png") for p in staged):
                killed = writers[0]
                os.kill(killed, signal.SIGKILL)
        _, stderr = export.communicate(timeout=60)
    finally:
        if export.poll() is None:
            export.kill()
            export.wait()
    assert killed is not None, "finished before its writing process could be killed"
    assert export.returncode == 1, stderr
    assert stderr.splitlines() == [
        f"Error: {out}: the process creating its files (pid {killed}) ended before the export"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fashion_lmdb"]


@two_cpus
def test_a_bad_record_after_many_leaves_nothing_and_no_process(tmp_path: Path) -> None:
    """The export fails (a record that is no Datum, after 5000 placed by the process): the
    one error naming the key, no OUT, no staging directory, and the process is gone."""
    rng = np.random.default_rng(5)
    records = {
        b"%08d" % i: array_to_datum(
            rng.integers(0, 256, (1, 6, 6), dtype=np.uint8), i % 10
        ).SerializeToString()
        for i in range(5000)
    }
    records[b"99999999"] = b"\xff not a Datum"
    db = write_raw_db(tmp_path / "db", "lmdb", records)
    out = tmp_path / "out" / "files"
    with pytest.raises(Exception, match="key 99999999") as raised:
        export_files(db, out)
    assert type(raised.value).__name__ == "DatumError"
    assert not (tmp_path / "out").exists()
    assert _children(os.getpid()) == []


@two_cpus
def test_an_interrupted_export_ends_its_process_and_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fashion_lmdb"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db)
    out = tmp_path / "files"
    export = subprocess.Popen([sys.executable, "-m", "mnist2db", "export", "--to", "files",
                               "--quiet", str(db), str(out)], stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    writers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while export.poll() is None and time.monotonic() < deadline:
            staged = [p for p in tmp_path.iterdir() if p.name.startswith(".files.")]
            writers = _children(export.pid)
            if writers and staged and any(p.rglob("*.png") for p in staged):
                export.send_signal(signal.SIGINT)
                break
        _, stderr = export.communicate(timeout=60)
    finally:
        if export.poll() is None:
            export.kill()
            export.wait()
    assert writers, "finished before it could be interrupted"
    assert export.returncode == 130, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fashion_lmdb"]
    assert not any(os.path.exists(f"/proc/{pid}") for pid in writers)
