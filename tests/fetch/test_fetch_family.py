"""fetch for the rest of the MNIST family: EMNIST's splits from one archive, QMNIST (.gz, .xz).

A loopback server serves a generated ``gzip.zip`` holding several splits and generated
QMNIST/xnist files; the table's digests are overridden (monkeypatch of ``DATASETS``, as in
tests/test_fetch.py) with the generated files' own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import lzma
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import idx_bytes, make_images, make_labels
from test_fetch import Route, Server, gz, listing

from mnist2db.cli.app import cli
from mnist2db.errors import DownloadError
from mnist2db.fetch import fetcher as fetch_module
from mnist2db.fetch.catalog import DATASETS, EMNIST_SPLITS, FILE_NAMES, Archive, Resource
from mnist2db.fetch.fetcher import fetch
from mnist2db.fetch.manifest import MANIFEST_NAME

SPLITS = ("letters", "digits", "balanced")


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_files(split: str) -> dict[str, bytes]:
    """A split's four files (unpacked, under MNIST's names) and its mapping, all distinct."""
    seed = SPLITS.index(split) * 10 if split in SPLITS else 90
    return {
        "train-images-idx3-ubyte": idx_bytes(make_images(20 + seed, seed=seed)),
        "train-labels-idx1-ubyte": idx_bytes(make_labels(20 + seed, seed=seed + 1)),
        "t10k-images-idx3-ubyte": idx_bytes(make_images(9 + seed, seed=seed + 2)),
        "t10k-labels-idx1-ubyte": idx_bytes(make_labels(9 + seed, seed=seed + 3)),
        f"emnist-{split}-mapping.txt": f"0 {48 + seed}\n1 {49 + seed}\n".encode(),
    }


MEMBER = {
    "train-images-idx3-ubyte": "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte": "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte": "test-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte": "test-labels-idx1-ubyte.gz",
}


def make_zip(splits: tuple[str, ...] = SPLITS, damage: str = "") -> bytes:
    """A gzip.zip laid out as EMNIST's: ``gzip/emnist-<split>-...`` members."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for split in splits:
            for name, data in split_files(split).items():
                if name in MEMBER:
                    member = f"gzip/emnist-{split}-{MEMBER[name]}"
                    body = gz({name: data})[name] if name != damage else b"not gzip at all"
                else:
                    member, body = f"gzip/{name}", data
                bundle.writestr(member, body)
    return buffer.getvalue()


ARCHIVE = make_zip()


def use_server(
    monkeypatch: pytest.MonkeyPatch,
    server: Server,
    body: bytes = ARCHIVE,
    published: bytes = ARCHIVE,
    **route: object,
) -> None:
    """The table's EMNIST entries pointed at the loopback server serving ``body``, with the
    digests of ``published``."""
    server.routes["/nist/gzip.zip"] = Route(body, **route)  # type: ignore[arg-type]
    digests = {"md5": md5(published), "sha256": sha256(published)}
    archive = Archive("gzip.zip", digests, len(published), "emnist")
    for split in EMNIST_SPLITS:
        name = f"emnist-{split}"
        spec = dataclasses.replace(DATASETS[name], mirrors=(server.url("nist"),), archive=archive)
        monkeypatch.setitem(DATASETS, name, spec)
    monkeypatch.setattr(fetch_module, "DEFAULT_BACKOFF", 0.0)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["fetch", *args])
    return result.exit_code, result.stderr


# -- the table --------------------------------------------------------------------------------


def test_table_has_emnist_splits_and_qmnist() -> None:
    for split in ("byclass", "bymerge", "balanced", "letters", "digits", "mnist"):
        spec = DATASETS[f"emnist-{split}"]
        assert spec.archive is not None and spec.archive.name == "gzip.zip"
        assert spec.archive.digests["md5"] == "58c8d27c78d21e728a6bc7b3cc06412e"
        assert len(spec.archive.digests["sha256"]) == 64
        assert spec.mirrors[0] == "https://biometrics.nist.gov/cs_links/EMNIST/"
        assert [r.name for r in spec.resources] == [*FILE_NAMES, f"emnist-{split}-mapping.txt"]
        assert spec.resources[2].remote == f"gzip/emnist-{split}-test-images-idx3-ubyte.gz"
    assert EMNIST_SPLITS["balanced"] == (112_800, 18_800, 47)
    qmnist = DATASETS["qmnist"]
    assert [r.remote for r in qmnist.resources] == [
        "qmnist-train-images-idx3-ubyte.gz",
        "qmnist-train-labels-idx2-int.gz",
        "qmnist-test-images-idx3-ubyte.gz",
        "qmnist-test-labels-idx2-int.gz",
    ]
    assert qmnist.resources[0].gz == {"md5": "ed72d4157d28c017586c42bc6afe6370"}
    assert qmnist.splits == (
        ("train", "qmnist-train-images-idx3-ubyte", "qmnist-train-labels-idx2-int"),
        ("test", "qmnist-test-images-idx3-ubyte", "qmnist-test-labels-idx2-int"),
    )
    nist = DATASETS["qmnist-nist"]
    assert [r.remote for r in nist.resources] == [
        "xnist-images-idx3-ubyte.xz",
        "xnist-labels-idx2-int.xz",
    ]
    assert [r.packing for r in nist.resources] == ["xz", "xz"]


# -- EMNIST -----------------------------------------------------------------------------------


def test_emnist_split_extracted_archive_kept_second_split_without_network(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    data = tmp_path / "data"
    code, stderr = run("--dataset", "emnist-letters", "--data", str(data / "emnist-letters"))
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert lines[0].startswith(
        f"{data / 'emnist' / 'gzip.zip'}: fetched from {server.url('nist')}gzip.zip ("
    )
    assert lines[0].endswith("verified (gzip.zip sha256)")
    assert lines[1].startswith(
        f"{data / 'emnist-letters' / 'train-images-idx3-ubyte'}: extracted from "
        f"{data / 'emnist' / 'gzip.zip'}:gzip/emnist-letters-train-images-idx3-ubyte.gz ("
    )
    assert lines[1].endswith("verified (in gzip.zip, gzip.zip sha256)")
    assert lines[-1] == f"emnist-letters: 5 files ready in {data / 'emnist-letters'}"
    assert server.count() == 1
    # Only that split, under MNIST's names; the archive kept as it was served.
    expected = split_files("letters")
    assert listing(data) == ["emnist", "emnist-letters"]
    assert listing(data / "emnist") == ["gzip.zip"]
    assert (data / "emnist" / "gzip.zip").read_bytes() == ARCHIVE
    assert listing(data / "emnist-letters") == sorted([MANIFEST_NAME, *expected])
    for name, body in expected.items():
        assert (data / "emnist-letters" / name).read_bytes() == body
    # The next split: from the kept archive (verified again), no request.
    code, stderr = run("--dataset", "emnist-digits", "--data", str(data / "emnist-digits"))
    assert code == 0, stderr
    assert stderr.splitlines()[0] == (
        f"{data / 'emnist' / 'gzip.zip'}: present, verified (gzip.zip sha256); not downloaded"
    )
    assert server.count() == 1
    for name, body in split_files("digits").items():
        assert (data / "emnist-digits" / name).read_bytes() == body
    assert listing(data) == ["emnist", "emnist-digits", "emnist-letters"]
    # Fetched again: every file present and verified (manifest), the archive not even read.
    os.chmod(data / "emnist" / "gzip.zip", 0)
    try:
        results = fetch("emnist-letters", data / "emnist-letters")
    finally:
        os.chmod(data / "emnist" / "gzip.zip", 0o644)
    assert [r.status for r in results] == ["present"] * 5
    assert results[0].verified_by == "unpacked sha256 recorded when fetched"
    assert server.count() == 1


def test_emnist_create_works_unchanged(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnist2db.create import create_databases

    use_server(monkeypatch, server)
    fetch("emnist-balanced", tmp_path / "data" / "emnist-balanced")
    results = create_databases(
        "emnist-balanced", tmp_path / "data" / "emnist-balanced", tmp_path / "out"
    )
    counts = {Path(r.path).name: r.count for r in results}
    assert counts == {"mnist_train_lmdb": 40, "mnist_test_lmdb": 29}


def test_emnist_archive_download_cut_is_resumed(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server, mode="cut", times=1, cut_at=5000)
    results = fetch("emnist-digits", tmp_path / "data" / "emnist-digits", retries=0)
    assert server.ranges("/nist/gzip.zip") == [None, "bytes=5000-"]
    assert (tmp_path / "data" / "emnist" / "gzip.zip").read_bytes() == ARCHIVE
    assert [r.status for r in results] == ["extracted"] * 5


def test_wrong_archive_refused_in_one_line_nothing_left(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = make_zip(("letters",))
    use_server(monkeypatch, server, body=wrong)
    data = tmp_path / "data"
    code, stderr = run("--dataset", "emnist-letters", "--data", str(data / "emnist-letters"))
    assert code == 1
    assert stderr == (
        f"Error: gzip.zip: rejected from every source: {server.url('nist')}gzip.zip "
        f"(checksum mismatch: got gzip.zip md5 {md5(wrong)}, gzip.zip sha256 {sha256(wrong)}; "
        f"expected gzip.zip md5 {md5(ARCHIVE)} or gzip.zip sha256 {sha256(ARCHIVE)})\n"
    )
    assert not (data / "emnist").exists()  # made by the run: removed
    assert not (data / "emnist-letters").exists()  # made by the run: removed


def test_kept_archive_that_fails_verification_is_downloaded_again(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    kept = tmp_path / "data" / "emnist" / "gzip.zip"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(ARCHIVE[:-10])  # truncated
    fetch("emnist-letters", tmp_path / "data" / "emnist-letters")
    assert server.count() == 1
    assert kept.read_bytes() == ARCHIVE


def test_archive_in_a_mirror_directory_is_read_in_place(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    (downloads / "gzip.zip").write_bytes(ARCHIVE)
    archive_dir = tmp_path / "keep"
    results = fetch(
        "emnist-balanced",
        tmp_path / "balanced",
        mirrors=[str(downloads)],
        archive_dir=archive_dir,
    )
    assert server.count() == 0
    assert not archive_dir.exists()  # not copied
    assert (
        results[0].source
        == f"{downloads / 'gzip.zip'}:gzip/emnist-balanced-train-images-idx3-ubyte.gz"
    )
    for name, body in split_files("balanced").items():
        assert (tmp_path / "balanced" / name).read_bytes() == body


def test_damaged_member_is_refused_nothing_under_its_name(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged = make_zip(damage="t10k-images-idx3-ubyte")
    use_server(monkeypatch, server, body=damaged, published=damaged)
    data = tmp_path / "letters"
    with pytest.raises(DownloadError) as info:
        fetch("emnist-letters", data, archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"t10k-images-idx3-ubyte: {tmp_path / 'keep' / 'gzip.zip'}:"
        "gzip/emnist-letters-test-images-idx3-ubyte.gz: not gzip data (it starts with "
        "b'not gzip at all')"
    )
    # The two files before it were placed (verified); nothing else under a final name.
    assert listing(data) == sorted(
        [MANIFEST_NAME, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    )


# -- QMNIST -------------------------------------------------------------------------------------


def idx2_int(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return idx_bytes(rng.integers(-5, 400_000, size=(rows, 8)).astype(">i4"))


QMNIST_RAW = {
    "qmnist-train-images-idx3-ubyte": idx_bytes(make_images(25, seed=3)),
    "qmnist-train-labels-idx2-int": idx2_int(25, 4),
    "qmnist-test-images-idx3-ubyte": idx_bytes(make_images(15, seed=5)),
    "qmnist-test-labels-idx2-int": idx2_int(15, 6),
}
# Big enough for several reads and output chunks; two xz streams in the labels file.
XNIST_RAW = {
    "xnist-images-idx3-ubyte": idx_bytes(make_images(3000, seed=7)),
    "xnist-labels-idx2-int": idx2_int(3000, 8),
}


def xz(data: bytes) -> bytes:
    half = len(data) // 2
    return lzma.compress(data[:half]) + lzma.compress(data[half:])


def use_qmnist(monkeypatch: pytest.MonkeyPatch, server: Server) -> dict[str, bytes]:
    packed = {f"{n}.gz": b for n, b in gz(QMNIST_RAW).items()}
    packed.update({f"{n}.xz": xz(b) for n, b in XNIST_RAW.items()})
    for name, body in packed.items():
        server.routes[f"/q/{name}"] = Route(body)
    for key in ("qmnist", "qmnist-nist"):
        spec = DATASETS[key]
        resources = tuple(
            dataclasses.replace(r, gz={"md5": md5(packed[r.remote])}) for r in spec.resources
        )
        monkeypatch.setitem(
            DATASETS,
            key,
            dataclasses.replace(spec, mirrors=(server.url("q"),), resources=resources),
        )
    return packed


def test_qmnist_fetched_under_its_own_names(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_qmnist(monkeypatch, server)
    code, stderr = run("--dataset", "qmnist", "--data", str(tmp_path / "q"))
    assert code == 0, stderr
    assert stderr.count("verified (.gz md5)") == 4
    assert listing(tmp_path / "q") == sorted([MANIFEST_NAME, *QMNIST_RAW])
    for name, body in QMNIST_RAW.items():
        assert (tmp_path / "q" / name).read_bytes() == body


def test_qmnist_nist_xz_unpacked_streaming(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = use_qmnist(monkeypatch, server)
    results = fetch("qmnist-nist", tmp_path / "x", keep_gz=True)
    assert [r.verified_by for r in results] == [".xz md5", ".xz md5"]
    for name, body in XNIST_RAW.items():
        assert (tmp_path / "x" / name).read_bytes() == body
        assert (tmp_path / "x" / f"{name}.xz").read_bytes() == packed[f"{name}.xz"]
    assert [r.status for r in fetch("qmnist-nist", tmp_path / "x", keep_gz=True)] == ["present"] * 2
    assert server.count() == 2


def test_damaged_xz_is_rejected(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = use_qmnist(monkeypatch, server)
    body = bytearray(packed["xnist-images-idx3-ubyte.xz"])
    body[200] ^= 0xFF
    server.routes["/q/xnist-images-idx3-ubyte.xz"] = Route(bytes(body))
    with pytest.raises(
        DownloadError,
        match=r"^xnist-images-idx3-ubyte: rejected from every "
        r"source: .*\(corrupt xz data",
    ):
        fetch("qmnist-nist", tmp_path / "x", retries=0)
    assert not (tmp_path / "x").exists()  # made by the run: removed


def test_xz_resource_through_a_directory_mirror(tmp_path: Path) -> None:
    from mnist2db.fetch.catalog import Dataset

    raw = XNIST_RAW["xnist-labels-idx2-int"]
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "xnist-labels-idx2-int.xz").write_bytes(xz(raw))
    spec = Dataset(
        "xz-only",
        (),
        (Resource("xnist-labels-idx2-int", unpacked={"sha256": sha256(raw)}, packing="xz"),),
        splits=(),
    )
    results = fetch(spec, tmp_path / "out", mirrors=[str(cache)])
    assert results[0].verified_by == "unpacked sha256"
    assert (tmp_path / "out" / "xnist-labels-idx2-int").read_bytes() == raw


def test_default_directories_and_archive_dir_option(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)
    monkeypatch.chdir(tmp_path)
    # This archive has no emnist-mnist members: one line; the verified archive stays.
    code, stderr = run("--dataset", "emnist-mnist")
    assert code == 1
    assert stderr.splitlines() == [
        stderr.splitlines()[0],
        "Error: train-images-idx3-ubyte: data/emnist/gzip.zip has no member "
        "gzip/emnist-mnist-train-images-idx3-ubyte.gz",
    ]
    assert stderr.startswith("data/emnist/gzip.zip: fetched from ")
    assert not (tmp_path / "data" / "emnist-mnist").exists()  # made by the run: removed
    code, stderr = run("--dataset", "emnist-balanced")
    assert code == 0, stderr
    assert stderr.splitlines()[-1] == "emnist-balanced: 5 files ready in data/emnist-balanced"
    assert server.count() == 1
    # Elsewhere with --archive-dir: that copy is made and used, the default one untouched.
    code, stderr = run("--dataset", "emnist-digits", "--archive-dir", "cache", "-q")
    assert code == 0 and stderr == ""
    assert server.count() == 2
    assert listing(tmp_path / "cache") == ["gzip.zip"]
    assert listing(tmp_path / "data") == ["emnist", "emnist-balanced", "emnist-digits"]


def test_interrupted_archive_download_leaves_nothing(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_server(monkeypatch, server)

    def interrupt(name: str, done: int, total: int) -> None:
        if name == "gzip.zip" and done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch(
            "emnist-letters",
            tmp_path / "letters",
            archive_dir=tmp_path / "keep",
            progress=interrupt,
        )
    assert not (tmp_path / "keep").exists()  # made by the run: removed
    assert not (tmp_path / "letters").exists()  # made by the run: removed


def test_member_unpacking_past_the_cap_is_refused(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnist2db.fetch import sink

    use_server(monkeypatch, server)
    monkeypatch.setattr(sink, "MAX_UNPACKED", 1000)  # the 1 GiB guard, scaled down
    with pytest.raises(DownloadError) as info:
        fetch("emnist-letters", tmp_path / "letters", archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"train-images-idx3-ubyte: {tmp_path / 'keep' / 'gzip.zip'}:"
        "gzip/emnist-letters-train-images-idx3-ubyte.gz: its IDX header declares 15696 bytes "
        "(20 x 28 x 28), more than the 1000 bytes an MNIST-format file can be"
    )
    assert not (tmp_path / "letters").exists()  # made by the run: removed


def test_archive_answer_far_beyond_its_size_is_refused(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnist2db.fetch import sink

    use_server(monkeypatch, server, body=ARCHIVE * 3)  # a zip, but endless as far as we care
    monkeypatch.setattr(sink, "MAX_UNPACKED", 1000)
    with pytest.raises(DownloadError) as info:
        fetch("emnist-letters", tmp_path / "letters", archive_dir=tmp_path / "keep")
    assert str(info.value) == (
        f"gzip.zip: rejected from every source: {server.url('nist')}gzip.zip "
        f"({3 * len(ARCHIVE)} bytes announced, gzip.zip is published as {len(ARCHIVE)} bytes)"
    )
    assert not (tmp_path / "keep").exists()  # made by the run: removed
