"""Faults nobody listed, injected for real: kills, interrupts, full disks, racing writers,
odd destinations, readers during writes, decompression bombs, permissions.

Processes that are killed or signalled run a small driver script (``fault_driver.py``) that replaces
``mnist2db.storage.files.checkpoint`` (a no-op hook at the staging life cycle's fixed points) or
the CLI's progress reporter with a function that writes a flag file and waits: the test
then knows exactly where the child is when it strikes. Nothing else is patched.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import make_images, make_labels, write_idx
from os_helpers import mounted_tmpfs

from mnist2db.cli.app import cli
from mnist2db.conversion import STAGING_MARK, convert
from mnist2db.errors import BackendError, IdxFormatError
from mnist2db.storage.databases.backends import detect_backend
from mnist2db.storage.databases.readers import iter_db, open_reader
from mnist2db.storage.db_staging import remove_stale_staging

SRC = Path(__file__).resolve().parent.parent / "src" / "mnist2db"

COUNT = 20_000  # 20 batches of 1000: enough for a "mid-way"
WAIT = 60.0  # generous upper bound for a child to reach a point; never a speed assertion

#: The child process of the kill and signal tests (see the module docstring).
DRIVER = Path(__file__).resolve().parent / "fault_driver.py"


# -- helpers ------------------------------------------------------------------------------


class Dataset:
    def __init__(self, directory: Path, count: int, seed: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.images = make_images(count, seed=seed)
        self.labels = make_labels(count, seed=seed + 1)
        self.images_path = write_idx(directory / "images-idx3-ubyte", self.images)
        self.labels_path = write_idx(directory / "labels-idx1-ubyte", self.labels)

    def args(self, out: Path | str) -> list[str]:
        return [str(self.images_path), str(self.labels_path), str(out)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset(tmp_path_factory.mktemp("data"), COUNT, seed=0)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """Different content, to tell which writer's database ended up at the destination."""
    return Dataset(tmp_path_factory.mktemp("other"), COUNT // 2, seed=7)


def assert_db(out: Path, ds: Dataset) -> None:
    """``out`` is a complete, valid database holding exactly ``ds``."""
    assert detect_backend(out) == "lmdb"
    n = 0
    for i, (key, datum) in enumerate(iter_db(out)):
        assert key == b"%08d" % i
        assert (datum.channels, datum.height, datum.width) == (1, 28, 28)
        assert datum.data == ds.images[i].tobytes()
        assert datum.label == int(ds.labels[i])
        n += 1
    assert n == len(ds.labels)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if STAGING_MARK in p.name)


def spawn(tmp_path: Path, argv: list[str], **cfg: object) -> tuple[subprocess.Popen[str], Path]:
    flag = tmp_path / f"flag-{time.monotonic_ns()}"
    config = {"argv": argv, "flag": str(flag), **cfg}
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, flag


def wait_for(flag: Path, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + WAIT
    while not flag.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"child ended ({proc.returncode}) before the pause point: {err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("child never reached the pause point")
        time.sleep(0.005)
    return flag.read_text()


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, out, err


def kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate()


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stderr


# -- 1. kill at any moment ----------------------------------------------------------------


@pytest.mark.parametrize("point", ["staging", "midway", "staged"])
def test_kill_before_the_move_leaves_nothing_and_rerun_succeeds(
    tmp_path: Path, data: Dataset, point: str
) -> None:
    out = tmp_path / "db"
    proc, flag = spawn(tmp_path, ["convert", "-q", *data.args(out)], pause=point)
    wait_for(flag, proc)
    kill(proc)
    assert not os.path.lexists(out)
    stale = leftovers(tmp_path)
    assert stale == [p for p in stale if f"{STAGING_MARK}{proc.pid}-" in p] and len(stale) == 1
    if point != "staging":
        assert (tmp_path / stale[0] / "data.mdb").stat().st_size > 0  # killed with data written

    code, err = run_cli("convert", "-q", *data.args(out))
    assert (code, err) == (0, "")
    assert_db(out, data)
    assert leftovers(tmp_path) == []  # the killed run's staging directory was removed


def test_kill_after_the_move_leaves_the_complete_database(tmp_path: Path, data: Dataset) -> None:
    out = tmp_path / "db"
    proc, flag = spawn(tmp_path, ["convert", "-q", *data.args(out)], pause="placed")
    wait_for(flag, proc)
    kill(proc)
    assert_db(out, data)
    code, err = run_cli("convert", "-q", *data.args(out))
    assert (code, err) == (1, f"Error: {out}: already exists (use --overwrite to replace it)\n")
    assert_db(out, data)


def test_kill_after_swap_with_overwrite_keeps_new_and_cleans_old(
    tmp_path: Path, data: Dataset, other: Dataset
) -> None:
    out = tmp_path / "db"
    convert(other.images_path, other.labels_path, out)
    argv = ["convert", "-q", "--overwrite", *data.args(out)]
    proc, flag = spawn(tmp_path, argv, pause="placed")
    staging = Path(wait_for(flag, proc))
    kill(proc)
    assert_db(out, data)
    assert_db(staging, other)  # the old database, swapped out, not yet removed
    code, err = run_cli("convert", "-q", "--overwrite", *other.args(out))
    assert (code, err) == (0, "")
    assert_db(out, other)
    assert leftovers(tmp_path) == []


def test_kill_unpaused_leaves_nothing_or_everything(tmp_path: Path, data: Dataset) -> None:
    """No hook at all: SIGKILL as soon as the staging directory has data, wherever it is."""
    out = tmp_path / "db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnist2db", "convert", "-q", *data.args(out)],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + WAIT
    while proc.poll() is None and time.monotonic() < deadline:
        if any((tmp_path / p / "data.mdb").exists() for p in leftovers(tmp_path)):
            break
        time.sleep(0.001)
    proc.kill()
    proc.communicate()
    if os.path.lexists(out):
        assert_db(out, data)
    else:
        code, err = run_cli("convert", "-q", *data.args(out))
        assert (code, err) == (0, "")
        assert_db(out, data)
    assert leftovers(tmp_path) == []


def test_stale_staging_of_live_or_other_runs_is_left_alone(tmp_path: Path, data: Dataset) -> None:
    out = tmp_path / "db"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        f".db{STAGING_MARK}{dead.pid}-abc_12": False,  # killed run, same destination: removed
        f".db{STAGING_MARK}{os.getppid()}-abc_12": True,  # a live process
        f".db2{STAGING_MARK}{dead.pid}-abc_12": True,  # another destination
        f".db{STAGING_MARK}{dead.pid}-abc_12.old": True,  # not a name convert makes
        f"db{STAGING_MARK}{dead.pid}-abc_12": True,  # not hidden: not ours
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.mdb").write_bytes(b"x")
    (tmp_path / f".db{STAGING_MARK}{dead.pid}-file").write_bytes(b"a file, not a directory")
    removed = remove_stale_staging(out)
    assert removed == [str(tmp_path / f".db{STAGING_MARK}{dead.pid}-abc_12")]
    for name, kept in names.items():
        assert (tmp_path / name).exists() == kept
    assert (tmp_path / f".db{STAGING_MARK}{dead.pid}-file").exists()


# -- 2. interrupt -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "code", "point"),
    [
        (signal.SIGINT, 130, "midway"),
        (signal.SIGTERM, 143, "midway"),
        (signal.SIGINT, 130, "staged"),
        (signal.SIGTERM, 143, "staging"),
    ],
)
def test_signal_cleans_up_and_exits_with_one_line(
    tmp_path: Path, data: Dataset, sig: int, code: int, point: str
) -> None:
    out = tmp_path / "db"
    proc, flag = spawn(tmp_path, ["convert", *data.args(out)], pause=point)
    wait_for(flag, proc)
    proc.send_signal(sig)
    assert finish(proc) == (code, "", "Interrupted\n")
    assert not os.path.lexists(out)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("first", "second", "code"), [("INT", "TERM", 130), ("TERM", "INT", 143)])
def test_second_signal_during_cleanup_is_ignored(
    tmp_path: Path, data: Dataset, first: str, second: str, code: int
) -> None:
    out = tmp_path / "db"
    release = tmp_path / "go"
    proc, flag = spawn(
        tmp_path,
        ["convert", *data.args(out)],
        pause="midway",
        pause_cleanup=True,
        release_cleanup=str(release),
    )
    wait_for(flag, proc)
    proc.send_signal(getattr(signal, f"SIG{first}"))
    staging = wait_for(Path(f"{flag}-cleanup"), proc)  # stopped just before the removal
    assert os.path.isdir(staging)
    proc.send_signal(getattr(signal, f"SIG{second}"))
    time.sleep(0.05)  # let it arrive (if it were acted on, the child would end here)
    release.touch()
    assert finish(proc) == (code, "", "Interrupted\n")
    assert not os.path.lexists(out)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_convert_mnist_data(tmp_path: Path, data: Dataset, sig: int, code: int) -> None:
    out = tmp_path / "db"
    # --minloglevel=1: the INFO lines Caffe logs before writing are not what is tested here.
    argv = ["--minloglevel=1", *data.args(out)]
    proc, flag = spawn(tmp_path, argv, pause="staged", tool="convert_mnist_data")
    wait_for(flag, proc)
    proc.send_signal(sig)
    assert finish(proc) == (code, "", "Interrupted\n")
    assert not os.path.lexists(out)
    assert leftovers(tmp_path) == []


def test_signal_with_overwrite_keeps_the_old_database(
    tmp_path: Path, data: Dataset, other: Dataset
) -> None:
    out = tmp_path / "db"
    convert(other.images_path, other.labels_path, out)
    proc, flag = spawn(tmp_path, ["convert", "--overwrite", *data.args(out)], pause="midway")
    wait_for(flag, proc)
    proc.send_signal(signal.SIGINT)
    assert finish(proc) == (130, "", "Interrupted\n")
    assert_db(out, other)
    assert leftovers(tmp_path) == []


# -- 3. full disk -------------------------------------------------------------------------


def test_file_size_limit_gives_one_error_and_no_leftovers(tmp_path: Path, data: Dataset) -> None:
    out = tmp_path / "db"
    proc, _ = spawn(tmp_path, ["convert", "-q", *data.args(out)], fsize=2 << 20)
    code, stdout, stderr = finish(proc)
    assert (code, stdout) == (1, "")
    assert stderr.startswith(f"Error: {out}: ") and stderr.count("\n") == 1, stderr
    assert stderr.endswith(" (the file size limit (ulimit -f) of 2097152 bytes was reached)\n")
    assert not os.path.lexists(out)
    assert leftovers(tmp_path) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "small", "4m") as mount:
        yield mount


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_full_disk_gives_one_error_and_no_leftovers(
    small_tmpfs: Path, data: Dataset, backend: str
) -> None:
    out = small_tmpfs / "db"
    code, err = run_cli("convert", "-q", f"--backend={backend}", *data.args(out))
    assert code == 1
    assert err.startswith(f"Error: {out}: ") and err.count("\n") == 1, err
    assert err.endswith(f" (the file system holding {small_tmpfs} is full)\n"), err
    assert os.listdir(small_tmpfs) == []  # nothing at the destination, no temporaries


# -- 4. racing writers --------------------------------------------------------------------


def test_two_writers_started_together(tmp_path: Path, data: Dataset) -> None:
    out = tmp_path / "db"
    procs = [spawn(tmp_path, ["convert", "-q", *data.args(out)])[0] for _ in range(2)]
    results = sorted(finish(p) for p in procs)
    assert [r[0] for r in results] == [0, 1]
    assert results[0][1:] == ("", "")
    assert results[1][2] in (
        f"Error: {out}: already exists (use --overwrite to replace it)\n",
        f"Error: {out}: appeared while converting; left it alone (use --overwrite to replace it)\n",
    )
    assert_db(out, data)
    assert leftovers(tmp_path) == []


def test_database_appearing_while_converting_is_left_alone(
    tmp_path: Path, data: Dataset, other: Dataset
) -> None:
    out = tmp_path / "db"
    release = tmp_path / "go"
    proc, flag = spawn(
        tmp_path, ["convert", "-q", *data.args(out)], pause="staged", release=str(release)
    )
    wait_for(flag, proc)
    assert run_cli("convert", "-q", *other.args(out)) == (0, "")  # the other writer wins
    release.touch()
    assert finish(proc) == (
        1,
        "",
        f"Error: {out}: appeared while converting; left it alone (use --overwrite to replace it)\n",
    )
    assert_db(out, other)
    assert leftovers(tmp_path) == []


def test_empty_directory_appearing_while_converting_is_not_replaced(
    tmp_path: Path, data: Dataset
) -> None:
    """rename(2) would silently replace an empty directory: the move must not."""
    out = tmp_path / "db"
    release = tmp_path / "go"
    proc, flag = spawn(
        tmp_path, ["convert", "-q", *data.args(out)], pause="staged", release=str(release)
    )
    wait_for(flag, proc)
    out.mkdir()
    release.touch()
    code, _, err = finish(proc)
    assert (code, err) == (
        1,
        f"Error: {out}: appeared while converting; left it alone (use --overwrite to replace it)\n",
    )
    assert out.is_dir() and os.listdir(out) == []
    assert leftovers(tmp_path) == []


def test_appearing_database_is_replaced_with_overwrite(
    tmp_path: Path, data: Dataset, other: Dataset
) -> None:
    out = tmp_path / "db"
    release = tmp_path / "go"
    argv = ["convert", "-q", "--overwrite", *data.args(out)]
    proc, flag = spawn(tmp_path, argv, pause="staged", release=str(release))
    wait_for(flag, proc)
    assert run_cli("convert", "-q", *other.args(out)) == (0, "")
    release.touch()
    assert finish(proc) == (0, "", "")
    assert_db(out, data)
    assert leftovers(tmp_path) == []


# -- 5. symlinks and odd paths ------------------------------------------------------------


def test_symlink_to_a_database_is_refused(tmp_path: Path, data: Dataset, other: Dataset) -> None:
    real = tmp_path / "real"
    convert(other.images_path, other.labels_path, real)
    link = tmp_path / "link"
    link.symlink_to(real)
    message = (
        f"Error: {link}: is a symbolic link (to {real}); mnist2db never replaces a link, "
        "even with --overwrite: remove it or choose another name\n"
    )
    assert run_cli("convert", "-q", *data.args(link)) == (1, message)
    assert run_cli("convert", "-q", "--overwrite", *data.args(link)) == (1, message)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert_db(real, other)


def test_dangling_symlink_is_refused(tmp_path: Path, data: Dataset) -> None:
    """No advice to use --overwrite, which refuses too: say why."""
    link = tmp_path / "link"
    target = tmp_path / "nowhere"
    link.symlink_to(target)
    message = (
        f"Error: {link}: is a symbolic link (to {target}, which does not exist); mnist2db "
        "never replaces a link, even with --overwrite: remove it or choose another name\n"
    )
    assert run_cli("convert", "-q", *data.args(link)) == (1, message)
    assert run_cli("convert", "-q", "--overwrite", *data.args(link)) == (1, message)
    assert link.is_symlink() and not target.exists()
    assert leftovers(tmp_path) == []


def test_symlinked_parent_directory_works(tmp_path: Path, data: Dataset) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    assert run_cli("convert", "-q", *data.args(tmp_path / "via" / "db")) == (0, "")
    assert_db(tmp_path / "real" / "db", data)


@pytest.mark.parametrize(
    "name",
    [
        "with spaces/my db",
        "ünïcödé/数据 lmdb",
        "trailing-slash/db/",
        "long/" + "n" * 250,
        "-dash/db",
    ],
)
def test_odd_paths_work(tmp_path: Path, data: Dataset, name: str) -> None:
    out = tmp_path / name
    assert run_cli("convert", "-q", *data.args(str(tmp_path) + "/" + name)) == (0, "")
    assert_db(out, data)
    assert leftovers(out.parent) == []


def test_odd_input_names_work(tmp_path: Path, data: Dataset) -> None:
    images = tmp_path / "images ü 数据"
    labels = tmp_path / "labels ü 数据"
    shutil.copy(data.images_path, images)
    labels.symlink_to(data.labels_path)
    assert run_cli("convert", "-q", str(images), str(labels), str(tmp_path / "db")) == (0, "")
    assert_db(tmp_path / "db", data)


def test_relative_path(tmp_path: Path, data: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli("convert", "-q", *data.args("rel/db")) == (0, "")
    assert_db(tmp_path / "rel" / "db", data)
    assert leftovers(tmp_path / "rel") == []


# -- 9. readers during writes -------------------------------------------------------------


def test_readers_never_see_a_partial_database(tmp_path: Path, data: Dataset) -> None:
    out = tmp_path / "db"
    release = tmp_path / "go"
    proc, flag = spawn(
        tmp_path, ["convert", "-q", *data.args(out)], pause="midway", release=str(release)
    )
    wait_for(flag, proc)
    for reader in (detect_backend, open_reader):
        with pytest.raises(BackendError, match=f"^{out}: no such database$"):
            reader(out)
    # The work in progress is hidden (a dot name) and lives beside the destination.
    (staging,) = leftovers(tmp_path)
    assert staging.startswith(f".db{STAGING_MARK}{proc.pid}-")
    release.touch()
    assert finish(proc) == (0, "", "")
    with open_reader(out) as reader:
        assert len(reader) == COUNT


@pytest.fixture
def read_only_copy(tmp_path: Path, data: Dataset) -> Iterator[Path]:
    src = tmp_path / "src"
    convert(data.images_path, data.labels_path, src / "db")
    mount = tmp_path / "ro"
    mount.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(src), str(mount)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(mount)], check=True, capture_output=True
        )
        yield mount / "db"
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_reading_from_read_only_media(read_only_copy: Path, data: Dataset) -> None:
    with pytest.raises(OSError):
        (read_only_copy / "probe").write_bytes(b"")  # really read-only, even for root
    with open_reader(read_only_copy) as reader:
        assert len(reader) == COUNT
    assert_db(read_only_copy, data)


# -- 7. decompression bombs ---------------------------------------------------------------


def write_zero_bomb(path: Path, head: bytes, zeros: int) -> None:
    """A valid gzip file of ``head`` followed by ``zeros`` zero bytes, streamed to disk.

    After a full flush deflate starts afresh, so every MiB of zeros compresses to the same
    bytes: compress one, write it ``zeros >> 20`` times, and frame the stream by hand.
    """
    mib = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    with path.open("wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
        f.write(first)
        for _ in range(zeros >> 20):
            f.write(block)
            crc = zlib.crc32(mib, crc)
        f.write(deflate.flush(zlib.Z_FINISH))
        f.write(struct.pack("<II", crc, (len(head) + zeros) & 0xFFFFFFFF))


def read_chars() -> int:
    """Bytes this process has read through read(2) and friends, from /proc/self/io."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.parametrize(
    "zeros",
    [
        4 << 30,  # 4 GiB: the gzip trailer's size wraps around to exactly what is declared
        1 << 30,  # 1 GiB: the trailer disagrees, and the length is counted
    ],
    ids=["4GiB-isize-wraps", "1GiB"],
)
def test_decompression_bomb_is_refused_early(tmp_path: Path, zeros: int) -> None:
    count = 10
    images = make_images(count)
    head = bytes([0, 0, 8, 3]) + struct.pack(">3I", count, 28, 28) + images.tobytes()
    bomb = tmp_path / "bomb-images-idx3-ubyte.gz"
    write_zero_bomb(bomb, head, zeros)
    with gzip.open(bomb) as stream:
        assert stream.read(len(head)) == head  # it is a real gzip stream
    labels = write_idx(tmp_path / "labels-idx1-ubyte", make_labels(count))
    out = tmp_path / "db"

    before = read_chars()
    tracemalloc.start()
    try:
        with pytest.raises(IdxFormatError) as info:
            convert(bomb, labels, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    compressed_read = read_chars() - before

    assert str(info.value).startswith(
        f"{bomb}: trailing bytes: header declares {count * 784} bytes of data "
        f"({count} × 28 × 28 uint8), file holds "
    )
    # The whole bomb is ~1 KiB of gzip per MiB of zeros: reading it would mean reading
    # megabytes of it; declared + one chunk is a few KiB plus the reader's buffers.
    assert compressed_read < bomb.stat().st_size // 4 < bomb.stat().st_size
    assert peak < 32 << 20
    assert not os.path.lexists(out)
    assert leftovers(tmp_path) == []


def test_info_on_a_decompression_bomb_is_bounded(tmp_path: Path) -> None:
    """info on a decompression bomb stops as convert does (it read 8 GiB of zeros to their end)."""
    head = bytes([0, 0, 8, 3]) + struct.pack(">3I", 1, 28, 28) + bytes(784)
    bomb = tmp_path / "bomb-images-idx3-ubyte.gz"
    write_zero_bomb(bomb, head, 4 << 30)
    CliRunner().invoke(cli, ["info", "--help"])  # the command's modules: their reads count too
    before = read_chars()
    result = CliRunner().invoke(cli, ["info", str(bomb)])
    compressed_read = read_chars() - before
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "size        800 bytes expected, at least 1049376 found (header 16 + data)" in lines
    assert lines[-1] == "valid       no"
    assert result.stderr == (
        f"Error: {bomb}: trailing bytes: header declares 784 bytes of data (1 × 28 × 28 uint8), "
        "file holds at least 1049360\n"
    )
    assert compressed_read < bomb.stat().st_size // 10  # ~2 %: one MiB of the 4 GiB


@pytest.mark.parametrize("gz", [False, True])
def test_header_claiming_terabytes_is_refused_before_allocating(tmp_path: Path, gz: bool) -> None:
    count, rows, cols = 1 << 20, 1 << 10, 1 << 10  # 1 TiB of pixels
    head = bytes([0, 0, 8, 3]) + struct.pack(">3I", count, rows, cols)
    body = head + bytes(4096)
    path = tmp_path / ("images.gz" if gz else "images")
    if gz:
        raw = bytearray(gzip.compress(body))
        raw[-4:] = struct.pack("<I", (len(head) + count * rows * cols) & 0xFFFFFFFF)
        path.write_bytes(bytes(raw))  # the trailer even claims the right (wrapped) size
    else:
        path.write_bytes(body)
    labels = write_idx(tmp_path / "labels", np.zeros(count, dtype=np.uint8))
    tracemalloc.start()
    try:
        with pytest.raises(IdxFormatError) as info:
            convert(path, labels, tmp_path / "db")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    declared = f"{path}: truncated: header declares {1 << 40} bytes of data "
    declared += f"({count} × 1024 × 1024 uint8), "
    size = path.stat().st_size
    if gz:  # refused from the file's size alone: deflate expands at most 1032-fold
        most = 1032 * size + (1 << 20)
        assert str(info.value) == declared + f"a gzip file of {size} bytes holds at most {most}"
    else:
        assert str(info.value) == declared + f"file holds {size - len(head)}"
    assert peak < 32 << 20


# -- 10. no shell, no surprises -----------------------------------------------------------


def test_no_shell_no_eval_in_the_package() -> None:
    banned_builtins = {"eval", "exec", "compile", "__import__"}
    banned_methods = {"system", "popen", "getoutput", "getstatusoutput", "spawnl", "spawnv"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in banned_builtins:
                    found.append(f"{path.name}:{node.lineno} {func.id}()")
                if isinstance(func, ast.Attribute) and func.attr in banned_methods:
                    found.append(f"{path.name}:{node.lineno} .{func.attr}()")
                for kw in node.keywords:
                    if kw.arg == "shell":
                        found.append(f"{path.name}:{node.lineno} shell=")
    assert found == []


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
@pytest.mark.parametrize(("umask", "dir_mode"), [(0o027, 0o750), (0o022, 0o755)])
def test_output_permissions_follow_the_umask(
    tmp_path: Path, backend: str, umask: int, dir_mode: int
) -> None:
    images = write_idx(tmp_path / "i", make_images(5))
    labels = write_idx(tmp_path / "l", make_labels(5))
    out = tmp_path / "db"
    old = os.umask(umask)
    try:
        convert(images, labels, out, backend=backend)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    files = list(out.iterdir())
    assert files
    for f in files:
        mode = stat.S_IMODE(f.stat().st_mode)
        assert mode & umask == 0, f"{f.name}: {oct(mode)}"
        assert mode & 0o600 == 0o600
    if backend == "lmdb":
        assert stat.S_IMODE((out / "data.mdb").stat().st_mode) == 0o664 & ~umask


# -- export's pair: both files or neither --------------------------------------------------


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, data: Dataset, other: Dataset) -> dict:
    """Databases of ``data`` and ``other``, and the IDX bytes an export of each gives."""
    root = tmp_path_factory.mktemp("exported")
    convert(data.images_path, data.labels_path, root / "new_db")
    convert(other.images_path, other.labels_path, root / "old_db")
    return {
        "new": root / "new_db",
        "old": root / "old_db",
        "new_bytes": (data.images_path.read_bytes(), data.labels_path.read_bytes()),
        "old_bytes": (other.images_path.read_bytes(), other.labels_path.read_bytes()),
    }


def pair_bytes(out: Path) -> tuple[bytes | None, bytes | None]:
    files = (out / "x-images-idx3-ubyte", out / "x-labels-idx1-ubyte")
    return tuple(f.read_bytes() if f.exists() else None for f in files)  # type: ignore[return-value]


def test_export_kill_between_the_two_renames_is_rolled_back(tmp_path: Path, exported: dict) -> None:
    out = tmp_path / "out"
    assert run_cli("export", "-q", str(exported["old"]), str(out), "--prefix", "x") == (0, "")
    argv = ["export", "-q", "--overwrite", str(exported["new"]), str(out), "--prefix", "x"]
    proc, flag = spawn(tmp_path, argv, pause="pair-first")
    wait_for(flag, proc)
    kill(proc)
    # SIGKILL between the renames: the first file is new, the second old, a journal says so.
    assert pair_bytes(out) == (exported["new_bytes"][0], exported["old_bytes"][1])
    assert any(".mnist2db-pair-" in name for name in hidden(out))
    # The next export of these files rolls the killed one back first, then does its own work.
    code, err = run_cli("export", "-q", str(exported["new"]), str(out), "--prefix", "x")
    assert (code, err) == (1, f"Error: {out / 'x-images-idx3-ubyte'}: already exists "
                              "(use --overwrite to replace it)\n")  # fmt: skip
    assert pair_bytes(out) == exported["old_bytes"]
    assert hidden(out) == []


def test_export_kill_between_renames_of_new_files_is_rolled_back(
    tmp_path: Path, exported: dict
) -> None:
    out = tmp_path / "out"
    argv = ["export", "-q", str(exported["new"]), str(out), "--prefix", "x"]
    proc, flag = spawn(tmp_path, argv, pause="pair-first")
    wait_for(flag, proc)
    kill(proc)
    assert pair_bytes(out) == (exported["new_bytes"][0], None)
    assert run_cli(*argv) == (0, "")  # the half-placed pair was taken back, then written whole
    assert pair_bytes(out) == exported["new_bytes"]
    assert hidden(out) == []


def test_export_rollback_keeps_a_file_changed_after_the_kill(
    tmp_path: Path, exported: dict
) -> None:
    """Recovery puts back only the file the killed run placed, never a user's newer one."""
    out = tmp_path / "out"
    argv = ["export", "-q", str(exported["new"]), str(out), "--prefix", "x"]
    proc, flag = spawn(tmp_path, argv, pause="pair-first")
    wait_for(flag, proc)
    kill(proc)
    (out / "x-images-idx3-ubyte").unlink()
    (out / "x-images-idx3-ubyte").write_bytes(b"the user's own")
    code, err = run_cli(*argv)
    assert code == 1 and "already exists" in err
    assert (out / "x-images-idx3-ubyte").read_bytes() == b"the user's own"
    assert hidden(out) == []


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_export_signal_between_the_renames_keeps_the_old_pair(
    tmp_path: Path, exported: dict, sig: int, code: int
) -> None:
    out = tmp_path / "out"
    assert run_cli("export", "-q", str(exported["old"]), str(out), "--prefix", "x") == (0, "")
    argv = ["export", "-q", "--overwrite", str(exported["new"]), str(out), "--prefix", "x"]
    proc, flag = spawn(tmp_path, argv, pause="pair-first")
    wait_for(flag, proc)
    proc.send_signal(sig)
    assert finish(proc) == (code, "", "Interrupted\n")
    assert pair_bytes(out) == exported["old_bytes"]
    assert hidden(out) == []


def test_export_second_rename_failing_puts_the_first_back(tmp_path: Path, exported: dict) -> None:
    """The labels target becomes a directory after the checks: the images go back too."""
    out = tmp_path / "out"
    assert run_cli("export", "-q", str(exported["old"]), str(out), "--prefix", "x") == (0, "")
    release = tmp_path / "go"
    argv = ["export", "-q", "--overwrite", str(exported["new"]), str(out), "--prefix", "x"]
    proc, flag = spawn(tmp_path, argv, pause="pair-first", release=str(release))
    wait_for(flag, proc)
    labels = out / "x-labels-idx1-ubyte"
    labels.unlink()
    labels.mkdir()
    (labels / "inside").write_text("mine")
    release.touch()
    code, stdout, err = finish(proc)
    assert (code, stdout) == (1, "")
    assert err == f"Error: {labels}: cannot write: Is a directory\n"
    assert (out / "x-images-idx3-ubyte").read_bytes() == exported["old_bytes"][0]
    assert (labels / "inside").read_text() == "mine"
    assert hidden(out) == []


def test_export_on_a_full_disk_leaves_nothing(small_tmpfs: Path, exported: dict) -> None:
    """ENOSPC while closing leaves no temporary, and the error names the file."""
    code, err = run_cli("export", "-q", str(exported["new"]), str(small_tmpfs), "--prefix", "x")
    assert code == 1
    assert (
        err
        == f"Error: {small_tmpfs / 'x-images-idx3-ubyte'}: cannot write: No space left on device\n"
    )
    assert os.listdir(small_tmpfs) == []


def test_png_on_a_full_disk_leaves_nothing(small_tmpfs: Path, tmp_path: Path) -> None:
    images = write_idx(tmp_path / "big-images-idx3-ubyte", make_images(1, 1000, 1000))
    png = small_tmpfs / "big.png"
    # Leave 64 KiB free: far less than the PNG of a million random pixels needs.
    (small_tmpfs / "filler").write_bytes(bytes((4 << 20) - (64 << 10)))
    code, err = run_cli("show", str(images), "--count", "1", "--png", str(png))
    assert code == 1
    assert err == f"Error: {png}: cannot write: No space left on device\n"
    assert sorted(os.listdir(small_tmpfs)) == ["filler"]


def test_a_journal_naming_other_files_moves_nothing(tmp_path: Path, exported: dict) -> None:
    """Recovery acts only on the outputs being exported (or beside its journal), with
    stagings named as ours."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "thesis.tex"
    victim.write_text("important")
    st = victim.stat()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    forged = [
        {
            "target": str(victim),
            "staging": str(tmp_path / f".thesis.tex.mnist2db-tmp-{dead.pid}-abc123"),
            "new": [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns],
            "replaces": False,
        },  # fmt: skip
        {
            "target": str(out / "x-images-idx3-ubyte"),
            "staging": str(victim),
            "new": [0, 0, 0, 0],
            "replaces": True,
        },  # fmt: skip
    ]
    journal = out / f".x-images-idx3-ubyte.mnist2db-pair-{dead.pid}-abc123"
    journal.write_text(json.dumps(forged))
    assert run_cli("export", "-q", str(exported["new"]), str(out), "--prefix", "x") == (0, "")
    assert victim.read_text() == "important"
    assert pair_bytes(out) == exported["new_bytes"]
    assert hidden(out) == []


@pytest.mark.parametrize("case", ["file/", "link/", ".", ".."])
def test_odd_destinations_are_refused_before_any_work(
    tmp_path: Path, data: Dataset, other: Dataset, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A trailing slash must not hide a file or follow a link; the current directory (or
    one holding it) is never replaced."""
    real = tmp_path / "real"
    convert(other.images_path, other.labels_path, real)
    (tmp_path / "file").write_text("mine")
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(real)
    messages = {
        "file/": f"{tmp_path / 'file'}: exists and is not a database directory; refusing to "
        "replace it",
        "link/": f"{tmp_path / 'link'}: is a symbolic link (to {real}); mnist2db never replaces "
        "a link, even with --overwrite: remove it or choose another name",
        ".": ".: is the current directory or holds it; refusing to replace it",
        "..": "..: is the current directory or holds it; refusing to replace it",
    }
    out = case if case in (".", "..") else f"{tmp_path}/{case}"
    code, err = run_cli("convert", "-q", "--overwrite", *data.args("x")[:2], out)
    assert (code, err) == (1, f"Error: {messages[case]}\n")
    assert (tmp_path / "file").read_text() == "mine"
    assert_db(real, other)
    assert leftovers(tmp_path) == [] and leftovers(real) == []


def test_two_exports_of_one_pair_never_interleave(tmp_path: Path, exported: dict) -> None:
    """A stopped between its two renames; B, exporting other data to the same files, waits
    for A's pair to be whole, then places its own: the result is one export's pair."""
    out = tmp_path / "out"
    release = tmp_path / "go"
    a_argv = ["export", "-q", "--overwrite", str(exported["old"]), str(out), "--prefix", "x"]
    a, flag = spawn(tmp_path, a_argv, pause="pair-first", release=str(release))
    wait_for(flag, a)
    b_argv = ["export", "-q", "--overwrite", str(exported["new"]), str(out), "--prefix", "x"]
    b, _ = spawn(tmp_path, b_argv)
    time.sleep(1.0)  # let B reach the lock A holds (never a speed assertion: B may be later)
    assert b.poll() is None or pair_bytes(out) == exported["new_bytes"]
    release.touch()
    assert finish(a) == (0, "", "")
    assert finish(b) == (0, "", "")
    assert pair_bytes(out) in (exported["new_bytes"], exported["old_bytes"])
    assert hidden(out) == []
