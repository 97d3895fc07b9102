"""Hostile lists and trees for ``imageset`` and ``convert_imageset``: a list given as a pipe,
a list that is one endless line, names no list line can hold, class folders linking to
their own parents, a resize no record can hold, an IDX written over a listed image. Real
processes, real pipes and links, a timeout on anything that could hang."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from png_helpers import png_of

from mnist2db.errors import ImageError
from mnist2db.formats.lists.image_list import ImageList, ListEntry, list_line, parse_line

PYTHON = sys.executable
MNIST2DB = f"{PYTHON} -m mnist2db imageset"
CONVERT_IMAGESET = f"{PYTHON} -c 'from mnist2db.caffe_tools.convert_imageset import main; main()'"


def shell(command: str, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``command`` run by bash in a real process (its address space at most ``limit``
    bytes); a hang ends at the timeout and fails the test."""

    def bounded() -> None:  # pragma: no cover - runs in the child
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60,
        check=False, preexec_fn=bounded,
    )  # fmt: skip


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused run (either front end), the prefix dropped."""
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    if last.startswith("Error: "):
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        return last[len("Error: ") :]
    assert last.startswith("E"), done.stderr
    return last.split("] ", 1)[1]


def lmdb_keys(path: Path) -> list[bytes]:
    import lmdb

    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        return [bytes(key) for key, _ in txn.cursor()]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.png").write_bytes(png_of(np.full((3, 4), i, dtype=np.uint8)))
    return root


LISTS = {
    "process substitution": "<(printf '0.png 0\\n1.png 1\\n2.png 2\\n')",
    "/dev/stdin": "/dev/stdin < <(printf '0.png 0\\n1.png 1\\n2.png 2\\n')",
}


@pytest.mark.parametrize("given_as", LISTS)
@pytest.mark.parametrize("front_end", ["imageset", "convert_imageset", "shuffled"])
def test_a_list_given_as_a_pipe_is_read_once(
    images: Path, tmp_path: Path, given_as: str, front_end: str
) -> None:
    """Caffe's ifstream reads a pipe; the second pass of a run (checked, then written) found
    it empty before: "no image could be read"."""
    listing = LISTS[given_as]
    command = {
        "imageset": f"{MNIST2DB} --list {listing} imgs/ out",
        "convert_imageset": f"{CONVERT_IMAGESET} imgs/ {listing} out",
        "shuffled": f"{CONVERT_IMAGESET} --shuffle --seed 3 imgs/ {listing} out",
    }[front_end]
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stderr
    keys = lmdb_keys(tmp_path / "out")
    assert sorted(k[9:] for k in keys) == [b"0.png", b"1.png", b"2.png"]
    if front_end != "shuffled":
        assert keys == [b"00000000_0.png", b"00000001_1.png", b"00000002_2.png"]


def test_a_pipe_is_copied_once_and_read_as_often_as_asked(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"a.png 1\n\nb c.png 2\r\n")
    os.close(write_end)
    try:
        listing = ImageList(f"/dev/fd/{read_end}")
        first = list(listing())
        assert first == [ListEntry(0, b"a.png", 1), ListEntry(2, b"b c.png", 2)]
        assert list(listing()) == first and list(listing()) == first
        listing.close()
    finally:
        os.close(read_end)


@pytest.mark.parametrize("front_end", ["imageset", "imageset --to idx", "convert_imageset"])
@pytest.mark.parametrize("listing", ["/dev/zero", "long.txt", "<(yes x | tr -d '\\n')"])
def test_a_list_that_is_one_endless_line_is_refused_in_one_line(
    images: Path, tmp_path: Path, front_end: str, listing: str
) -> None:
    """Refused when 64 KiB of one line have been read, in a child limited to 1.5 GiB of
    address space (before: read until MemoryError, or forever)."""
    (tmp_path / "long.txt").write_bytes(b"0.png 1\n" + b"x" * (1 << 20) + b" 2\n")
    command = {
        "imageset": f"{MNIST2DB} --list {listing} imgs/ out",
        "imageset --to idx": f"{MNIST2DB} --to idx --list {listing} imgs/ out",
        "convert_imageset": f"{CONVERT_IMAGESET} imgs/ {listing} out",
    }[front_end]
    done = shell(command, tmp_path, limit=3 << 29)
    line = 2 if listing == "long.txt" else 1
    message = one_error(done)
    assert message.endswith(
        f":{line}: longer than 65536 bytes: not a 'PATH LABEL' line (is it a list?)"
    )
    assert sorted(os.listdir(tmp_path)) == ["imgs", "long.txt"]


@given(st.binary(min_size=1, max_size=40), st.integers(-(1 << 31), (1 << 31) - 1))
def test_a_list_line_mnist2db_writes_reads_back_or_is_refused(path: bytes, label: int) -> None:
    entry = ListEntry(5, path, label)
    try:
        line = list_line(entry)
    except ImageError as exc:
        assert "a name no list line can hold" in str(exc)
        return
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_line(line[:-1], 5, "list") == entry


@pytest.mark.parametrize(
    ("folder", "name"), [("cat", "new\nline.png"), ("cat", "tab\r\n.png"), (" cat", "ok.png")]
)
def test_a_file_name_no_list_line_can_hold_is_refused_naming_it(
    tmp_path: Path, folder: str, name: str
) -> None:
    """The list written beside the output (OUT.list.txt) must read back: before, a newline
    in a name was written into it and the list could not be read back (a class folder with
    a leading space came back without it)."""
    root = tmp_path / "tree"
    (root / folder).mkdir(parents=True)
    (root / folder / "ok.png").write_bytes(png_of(np.zeros((2, 2), dtype=np.uint8)))
    (root / folder / name).write_bytes(png_of(np.zeros((2, 2), dtype=np.uint8)))
    done = shell(f"{MNIST2DB} tree out", tmp_path)
    shown = repr(f"tree/{folder}/{name}")[1:-1]
    assert one_error(done) == (
        f"{shown}: a name no list line can hold (a newline, or a space or tab at an end): "
        "rename it, or hide it with a leading '.'"
    )
    assert sorted(os.listdir(tmp_path)) == ["tree"]


def test_names_with_inner_spaces_and_tabs_are_written_to_a_list_that_reads_back(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tree"
    (root / "my cat").mkdir(parents=True)
    for name in ("a b.png", "c\td.png", "e  f.png"):
        (root / "my cat" / name).write_bytes(png_of(np.zeros((2, 2), dtype=np.uint8)))
    done = shell(f"{MNIST2DB} tree out && {MNIST2DB} --list out.list.txt tree/ again", tmp_path)
    assert done.returncode == 0, done.stderr
    assert lmdb_keys(tmp_path / "again") == lmdb_keys(tmp_path / "out")
    assert lmdb_keys(tmp_path / "out")[1] == b"00000001_my cat/c\td.png"


def test_class_folders_linking_to_their_parents_are_walked_once(tmp_path: Path) -> None:
    """Each folder is walked once per class, known by its device and inode: links back up
    are skipped and reported (before: os.walk followed them until the path was too long,
    exponentially with several links; still walking at the timeout)."""
    root = tmp_path / "tree"
    deep = root / "cat" / "a" / "b"
    deep.mkdir(parents=True)
    (root / "dog").mkdir()
    for folder in (root / "cat", deep, root / "dog"):
        (folder / "x.png").write_bytes(png_of(np.zeros((2, 2), dtype=np.uint8)))
    for i, target in enumerate(["..", "../..", "../../.."] * 2):
        (deep / f"up{i}").symlink_to(target)
    done = shell(f"{MNIST2DB} tree out", tmp_path)
    assert done.returncode == 0, done.stderr
    # up2 (the root) is the first link, in name order, to a folder not yet walked: dog.
    assert (tmp_path / "out.list.txt").read_text() == (
        "cat/x.png 0\ncat/a/b/x.png 0\ncat/a/b/up2/dog/x.png 0\ndog/x.png 1\n"
    )
    assert len(lmdb_keys(tmp_path / "out")) == 4
    assert (
        "skipped 6 links to folders already walked: cat/a/b/up0, cat/a/b/up1, cat/a/b/up3, "
        "cat/a/b/up4, cat/a/b/up5 …" in done.stderr
    )


@pytest.mark.parametrize(
    ("front_end", "channels"),
    [("imageset", 3), ("imageset --gray", 1), ("imageset --to idx", 1), ("convert_imageset", 3)],
)
def test_a_resize_no_record_can_hold_is_refused_up_front(
    images: Path, tmp_path: Path, front_end: str, channels: int
) -> None:
    """100000 × 100000: refused in one line before any image is read, in a child limited to
    1.5 GiB (before: numpy allocated it for the first image, a MemoryError traceback)."""
    (tmp_path / "list.txt").write_text("0.png 0\n")
    if front_end == "convert_imageset":
        args = "--resize_width 100000 --resize_height 100000 imgs/ list.txt out"
        command = f"{CONVERT_IMAGESET} {args}"
    else:
        command = f"{MNIST2DB} {front_end[9:]} --resize 100000x100000 --list list.txt imgs out"
    done = shell(command, tmp_path, limit=3 << 29)
    assert one_error(done) == (
        f"cannot resize to 100000 × 100000: an image of {channels} × 100000 × 100000 is "
        f"{channels * 10**10} bytes, more than a record holds (protobuf's 2 GiB)"
    )
    assert sorted(os.listdir(tmp_path)) == ["imgs", "list.txt"]


def test_idx_overwrite_never_lands_on_an_image_its_list_names(tmp_path: Path) -> None:
    """A list naming ../victim-images-idx3-ubyte (an image there) and --overwrite of
    victim: refused before any work, the image untouched (before: replaced by the IDX)."""
    (tmp_path / "imgs").mkdir()
    picture = png_of(np.full((2, 2), 9, dtype=np.uint8))
    (tmp_path / "ok.png").write_bytes(picture)
    (tmp_path / "victim-images-idx3-ubyte").write_bytes(picture)
    (tmp_path / "list.txt").write_text("../ok.png 0\n../victim-images-idx3-ubyte 1\n")
    done = shell(f"{MNIST2DB} --to idx --overwrite --list list.txt imgs/ victim", tmp_path)
    assert one_error(done) == (
        "victim-images-idx3-ubyte: is the input imgs/../victim-images-idx3-ubyte; refusing "
        "to replace it"
    )
    assert (tmp_path / "victim-images-idx3-ubyte").read_bytes() == picture
    assert sorted(os.listdir(tmp_path)) == [
        "imgs",
        "list.txt",
        "ok.png",
        "victim-images-idx3-ubyte",
    ]


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (its SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(mask, 16) & (1 << (15 - 1)))


@pytest.mark.parametrize("front_end", ["imageset", "convert_imageset"])
def test_a_list_fifo_without_a_writer_waits_and_sigterm_ends_it(
    images: Path, tmp_path: Path, front_end: str
) -> None:
    """A FIFO list waits for its writer, as Caffe's ifstream waits; SIGTERM ends the wait
    within a second: exit 143, "Interrupted", nothing written."""
    import signal
    import time

    os.mkfifo(tmp_path / "list.fifo")
    command = {
        "imageset": f"exec {MNIST2DB} --list list.fifo imgs/ out",
        "convert_imageset": f"exec {CONVERT_IMAGESET} imgs/ list.fifo out",
    }[front_end]
    child = subprocess.Popen(
        ["bash", "-c", command], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not catches_sigterm(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # Python starting up: SIGTERM's handler not yet installed
        time.sleep(0.5)
        assert child.poll() is None  # waiting for a writer
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=5)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 143, stderr
    assert "Interrupted" in stderr and "Traceback" not in stderr
    assert sorted(os.listdir(tmp_path)) == ["imgs", "list.fifo"]
