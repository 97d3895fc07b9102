"""fetch uses only the bytes it verified: the archive is hashed
and extracted through one open file while another process swaps it; published digests beat
the manifest; damaged, misplaced, stale or sparse files are named in one line or cleaned up.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import idx_bytes
from os_helpers import dead_pid
from test_fetch import Server, gz, make_spec, quick, sha256, small_files
from test_fetch_family import ARCHIVE, split_files, use_server

from mnist2db.cli.app import cli
from mnist2db.errors import ChecksumError, DownloadError
from mnist2db.fetch.catalog import DATASETS, FILE_NAMES, Dataset, Resource
from mnist2db.fetch.fetcher import fetch
from mnist2db.fetch.manifest import MANIFEST_NAME

# -- the archive: hashed and used through one handle ----------------------------------------

SWAPPER = r"""
import os, sys, time
target, genuine, forged, stop = sys.argv[1:5]
deadline = time.monotonic() + 60
i = 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    link = f"{target}.swap{i % 2}"
    try:
        os.symlink(forged if i % 2 else genuine, link)
        os.replace(link, target)
    except OSError:
        pass
    i += 1
os.symlink(genuine, f"{target}.swap2")
os.replace(f"{target}.swap2", target)  # the genuine one left in place
"""


def forged_archive() -> bytes:
    """Same member names as ARCHIVE (the letters split), other contents."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(ARCHIVE)) as genuine,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as forged,
    ):
        for info in genuine.infolist():
            body = genuine.read(info)
            if info.filename.endswith(".gz"):
                body = gzip.compress(gzip.decompress(body)[:-1] + b"\x07", mtime=0)
            forged.writestr(info.filename, body)
    return buffer.getvalue()


def test_a_swapped_archive_is_never_extracted(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real process renames a forged archive over the verified one and back, as fast as it
    can, in a --mirror directory: every run extracts the genuine members or fails in one
    line; on main about a quarter of the runs extracted the forged ones."""
    use_server(monkeypatch, server)  # the table's digests are ARCHIVE's
    spec = dataclasses.replace(DATASETS["emnist-letters"], mirrors=())  # the directory only
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    genuine, forged = tmp_path / "genuine.zip", tmp_path / "forged.zip"
    genuine.write_bytes(ARCHIVE)
    forged.write_bytes(forged_archive())
    target, stop = downloads / "gzip.zip", tmp_path / "stop"
    os.symlink(genuine, target)
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(target), str(genuine), str(forged), str(stop)]
    )
    expected = split_files("letters")
    outcomes = {"extracted": 0, "refused": 0}
    try:
        # At least 40 runs, and on until one extracted: on a loaded machine the swapper can
        # win every one of the first 40 (each run then takes longer than a swap); it stops by
        # itself after 60 s, the genuine one in place, so a run that is not raced comes by then.
        for run in range(100_000):
            if run >= 40 and outcomes["extracted"]:
                break
            data = tmp_path / f"run{run}"
            try:
                results = fetch(
                    spec,
                    data,
                    mirrors=[str(downloads)],
                    archive_dir=tmp_path / "keep",
                    **quick(retries=0),
                )
            except DownloadError as exc:
                # The forged copy hashed, or a change noticed: one line, nothing placed
                # that is not genuine (files placed before stay, and are genuine).
                assert "\n" not in str(exc)
                outcomes["refused"] += 1
            else:
                assert [r.status for r in results] == ["extracted"] * 5
                outcomes["extracted"] += 1
            if data.exists():
                for name in os.listdir(data):
                    if name != MANIFEST_NAME:
                        assert (data / name).read_bytes() == expected[name], (run, name)
    finally:
        stop.touch()
        swapper.wait(10)
    assert outcomes["extracted"] > 0, outcomes
    assert not (tmp_path / "keep").exists()  # read in place, never copied


def test_the_kept_download_is_read_through_its_own_descriptor(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept archive's name swapped under the fetch (a shared /tmp/emnist): the download
    is extracted through the temporary's descriptor, whatever the name holds meanwhile."""
    use_server(monkeypatch, server)
    keep = tmp_path / "keep"
    keep.mkdir()
    genuine, forged = tmp_path / "genuine.zip", tmp_path / "forged.zip"
    genuine.write_bytes(ARCHIVE)
    forged.write_bytes(forged_archive())
    target, stop = keep / "gzip.zip", tmp_path / "stop"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(target), str(forged), str(forged), str(stop)]
    )
    expected = split_files("letters")
    try:
        deadline = time.monotonic() + 10
        while not os.path.lexists(target) and time.monotonic() < deadline:
            time.sleep(0.01)
        for run in range(10):
            data = tmp_path / f"run{run}"
            try:
                fetch("emnist-letters", data, archive_dir=keep, **quick(retries=0))
            except DownloadError as exc:
                assert "\n" not in str(exc)
            if data.exists():
                for name in os.listdir(data):
                    if name != MANIFEST_NAME:
                        assert (data / name).read_bytes() == expected[name], (run, name)
    finally:
        stop.touch()
        swapper.wait(10)
    assert server.count() >= 1  # the forged kept copy never verified: downloaded


# -- published digests beat the manifest ----------------------------------------------------


def test_a_published_digest_beats_the_manifest(server: Server, tmp_path: Path) -> None:
    raw = small_files()
    packed = gz(raw)
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))  # unpacked sha256 published, as Fashion
    fetch(spec, tmp_path, **quick())
    sevens = idx_bytes(np.full(30, 7, dtype=np.uint8))  # a valid label file, all sevens
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(sevens)
    manifest = (tmp_path / MANIFEST_NAME).read_text()
    manifest = manifest.replace(sha256(raw["train-labels-idx1-ubyte"]), sha256(sevens))
    (tmp_path / MANIFEST_NAME).write_text(manifest)
    results = fetch(spec, tmp_path, **quick())
    assert [r.status for r in results] == ["present", "downloaded", "present", "present"]
    assert (tmp_path / "train-labels-idx1-ubyte").read_bytes() == raw["train-labels-idx1-ubyte"]


def test_md5_alone_is_not_enough_where_a_sha256_is_published(
    server: Server, tmp_path: Path
) -> None:
    # A file whose md5 matches while the sha256 published beside it does not (what an md5
    # collision would give) is a mismatch; md5 alone counts only where it is all there is.
    raw = small_files()
    packed = gz(raw)
    name = FILE_NAMES[0]
    server.serve("a", packed)
    md5 = hashlib.md5(packed[name]).hexdigest()
    both = Dataset("t", (server.url("a"),), (Resource(name, gz={"sha256": "0" * 64, "md5": md5}),))
    with pytest.raises(ChecksumError, match=r"checksum mismatch: got \.gz sha256 "):
        fetch(both, tmp_path / "x", **quick())
    alone = Dataset("t", (server.url("a"),), (Resource(name, gz={"md5": md5}),))
    assert fetch(alone, tmp_path / "y", **quick())[0].verified_by == ".gz md5"
    strongest = Dataset(
        "t",
        (server.url("a"),),
        (Resource(name, gz={"md5": md5, "sha256": sha256(packed[name])}),),
    )
    assert fetch(strongest, tmp_path / "z", **quick())[0].verified_by == ".gz sha256"


# -- archives: damaged, misplaced, stale, sparse --------------------------------------------


def damaged_member_archive() -> bytes:
    """ARCHIVE with one member's deflate data broken (its CRC no longer checked first)."""
    data = bytearray(ARCHIVE)
    with zipfile.ZipFile(io.BytesIO(ARCHIVE)) as bundle:
        info = bundle.getinfo("gzip/emnist-letters-train-labels-idx1-ubyte.gz")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start, start + min(info.compress_size, 40)):
        data[i] ^= 0x55
    return bytes(data)


def test_a_damaged_member_in_a_verified_archive_is_one_line(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged = damaged_member_archive()
    use_server(monkeypatch, server, body=damaged, published=damaged)
    data = tmp_path / "letters"
    result = CliRunner().invoke(
        cli,
        ["fetch", "--dataset", "emnist-letters", "--data", str(data), "-q"]
        + ["--archive-dir", str(tmp_path / "keep")],
    )
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = (
        f"Error: train-labels-idx1-ubyte: cannot read {tmp_path / 'keep' / 'gzip.zip'}:"
        "gzip/emnist-letters-train-labels-idx1-ubyte.gz: damaged member ("
    )
    assert result.stderr.startswith(line), result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(os.listdir(data)) == [MANIFEST_NAME, "train-images-idx3-ubyte"]


def test_a_rejected_kept_archive_with_no_mirror_left_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: Server
) -> None:
    use_server(monkeypatch, server)
    spec = dataclasses.replace(DATASETS["emnist-letters"], mirrors=())
    kept = tmp_path / "keep" / "gzip.zip"
    kept.parent.mkdir()
    kept.write_bytes(ARCHIVE[:100] + bytes([ARCHIVE[100] ^ 1]) + ARCHIVE[101:])
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path / "letters", archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"gzip.zip: rejected from every source: {kept} "
        "(does not match the published digests of gzip.zip)"
    )
    kept.write_bytes(ARCHIVE[:100])
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path / "letters", archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"gzip.zip: rejected from every source: {kept} "
        f"(100 bytes, gzip.zip is published as {len(ARCHIVE)} bytes)"
    )
    assert kept.read_bytes() == ARCHIVE[:100]  # not ours to remove


def test_a_kept_archive_path_that_is_a_directory_is_refused_before_downloading(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    (tmp_path / "keep" / "gzip.zip").mkdir(parents=True)
    with pytest.raises(DownloadError) as info:
        fetch("emnist-letters", tmp_path / "letters", archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"{tmp_path / 'keep' / 'gzip.zip'}: is a directory, where the verified archive is "
        "to be kept"
    )
    assert server.count() == 0
    assert not (tmp_path / "letters").exists()


def test_stale_temporaries_of_a_killed_archive_download_are_removed(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    keep = tmp_path / "keep"
    keep.mkdir()
    dead = dead_pid()
    stale = keep / f".gzip.zip.mnist2db-tmp-{dead}-9f8e7d6c5b4a"
    live = keep / ".gzip.zip.mnist2db-tmp-1-9f8e7d6c5b4a"  # pid 1 runs: not ours to judge
    other = keep / f".gzip.zip.backup-{dead}"  # not a name mnist2db makes
    for path in (stale, live, other):
        path.write_bytes(b"partial")
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    (downloads / "gzip.zip").write_bytes(ARCHIVE)
    fetch("emnist-letters", tmp_path / "letters", mirrors=[str(downloads)], archive_dir=keep)
    assert sorted(os.listdir(keep)) == sorted([live.name, other.name])


def test_sparse_files_at_final_names_are_checked_by_size_before_hashing(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    keep = tmp_path / "keep"
    keep.mkdir()
    data = tmp_path / "letters"
    data.mkdir()
    for path in (keep / "gzip.zip", data / "train-images-idx3-ubyte"):
        with open(path, "wb") as handle:
            handle.truncate(200 << 30)  # 200 GiB: minutes to hash
    start = time.monotonic()
    results = fetch("emnist-letters", data, archive_dir=keep)
    assert time.monotonic() - start < 5
    assert [r.status for r in results] == ["extracted"] * 5
    assert (keep / "gzip.zip").read_bytes() == ARCHIVE
    assert (data / "train-images-idx3-ubyte").read_bytes() == split_files("letters")[
        "train-images-idx3-ubyte"
    ]


def test_a_sparse_unpacked_file_of_a_plain_dataset_is_not_hashed(
    server: Server, tmp_path: Path
) -> None:
    raw = small_files()
    packed = gz(raw)
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))
    tmp_path.joinpath("data").mkdir()
    with open(tmp_path / "data" / FILE_NAMES[0], "wb") as handle:
        handle.write(raw[FILE_NAMES[0]][:16])  # its header declares 23 536 bytes
        handle.truncate(200 << 30)
    start = time.monotonic()
    results = fetch(spec, tmp_path / "data", **quick())
    assert time.monotonic() - start < 5
    assert results[0].status == "downloaded"


# -- create reads only what fetch verified ---------------------------------------------------------


def test_create_refuses_a_fetched_file_changed_since(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = small_files()
    packed = gz(raw)
    server.serve("a", packed)
    spec = dataclasses.replace(make_spec(raw, packed, (server.url("a"),)), name="fashion-mnist")
    monkeypatch.setitem(DATASETS, "fashion-mnist", spec)
    data, out = tmp_path / "data", tmp_path / "out"
    fetch("fashion-mnist", data, **quick())
    sevens = idx_bytes(np.full(30, 7, dtype=np.uint8))  # a valid label file, all sevens
    (data / "train-labels-idx1-ubyte").write_bytes(sevens)
    manifest = (data / MANIFEST_NAME).read_text()
    manifest = manifest.replace(sha256(raw["train-labels-idx1-ubyte"]), sha256(sevens))
    (data / MANIFEST_NAME).write_text(manifest)
    args = ["create", "--dataset", "fashion-mnist", "--data", str(data), "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {data / 'train-labels-idx1-ubyte'}: not the file mnist2db fetch verified "
        f"(changed since, or never fetched); run: mnist2db fetch --dataset fashion-mnist "
        f"--data {data} (it fetches it again)\n"
    )
    assert not out.exists()  # refused before any work
    fetch("fashion-mnist", data, **quick())  # fetched again, as the message says
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.stderr
    assert sorted(os.listdir(out)) == ["mnist_test_lmdb", "mnist_train_lmdb"]
