"""mnist2db export --to webdataset: tar shards and their manifest (mnist2db.exporting.webdataset.shards),
read back by the webdataset library, every sample compared with its record; shards complete
or absent; a SIGKILLed export resumed shard by shard to the same bytes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_raw_db
from helpers import fashion_file
from PIL import Image

from mnist2db import array_to_datum, convert, iter_db
from mnist2db.cli.app import cli

wds = pytest.importorskip("webdataset", reason="webdataset is a test dependency (the test extra)")

CORPUS = Path(__file__).parent / "data" / "export"


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def read_back(manifest: Path) -> list[dict]:
    """Every sample of the shards ``manifest`` lists, as the webdataset library reads them:
    its tar reader and its grouping of members into samples (what ``wds.WebDataset`` runs;
    used here on files this test opens and closes, which WebDataset leaves to the garbage
    collector, a ResourceWarning under pytest)."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    listed = json.loads(manifest.read_text())
    samples: list[dict] = []
    for entry in listed["shards"]:
        with open(manifest.parent / entry["name"], "rb") as stream:
            members = tar_file_iterator(stream)
            samples.extend(group_by_keys(dict(m, __url__=entry["name"]) for m in members))
    return samples


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as picture:
        return np.asarray(picture)


def _fashion_db(tmp_path: Path, count: int, backend: str = "lmdb", **options: object) -> Path:
    db = tmp_path / f"fashion_{backend}"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db,
            count=count, backend=backend, **options)  # fmt: skip
    return db


@pytest.mark.parametrize("encoded", [None, "png"])
def test_shards_read_back_by_webdataset(tmp_path: Path, backend: str, encoded: str | None) -> None:
    db = _fashion_db(tmp_path, 1234, backend, encoded=encoded)
    out = tmp_path / "shards" / "fashion"
    result = run("export", "--to", "webdataset", "--shard-size", 500, db, out)
    assert result.exit_code == 0, result.output
    manifest = json.loads(Path(f"{out}.shards.json").read_text())
    assert manifest["complete"] and manifest["records"] == 1234
    assert [e["name"] for e in manifest["shards"]] == [f"fashion-00000{i}.tar" for i in range(3)]
    assert [e["records"] for e in manifest["shards"]] == [500, 500, 234]
    for entry in manifest["shards"]:
        data = (out.parent / entry["name"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"])
    assert result.stderr == (
        f"Wrote 3 shards (1234 records, {sum(e['bytes'] for e in manifest['shards'])} bytes) "
        f"and {out}.shards.json.\n"
    )
    samples = read_back(Path(f"{out}.shards.json"))
    assert len(samples) == 1234
    for sample, (key, datum) in zip(samples, iter_db(db), strict=True):
        assert sample["__key__"] == key.decode() and set(sample) >= {"png", "cls"}
        assert "json" not in sample
        assert int(sample["cls"]) == datum.label
        if encoded:
            assert sample["png"] == datum.data  # the stored bytes, as they are
        else:
            assert np.array_equal(
                pixels(sample["png"]), np.frombuffer(datum.data, np.uint8).reshape(28, 28)
            )


def test_caffe_keys_are_mapped_and_kept_in_json(tmp_path: Path, capsys) -> None:
    from mnist2db.caffe_tools.convert_imageset import convert_imageset

    made = tmp_path / "made"
    assert convert_imageset(["--encoded", f"{CORPUS}/images/", str(CORPUS / "list.txt"),
                             str(made)]) == 0  # fmt: skip
    out = tmp_path / "images"
    result = run("export", "--to", "webdataset", made, out)
    assert result.exit_code == 0, result.output
    assert "  7 keys are not sample names: mapped, the key in KEY.json" in result.stderr
    samples = read_back(Path(f"{out}.shards.json"))
    expected = list(iter_db(made))
    assert len(samples) == len(expected) == 7
    for sample, (key, datum) in zip(samples, expected, strict=True):
        assert "." not in sample["__key__"] and "/" not in sample["__key__"]
        assert json.loads(sample["json"]) == {"key": key.decode(), "label": datum.label}
        ext = {"jpg", "png", "bmp"} & set(sample)
        assert len(ext) == 1 and sample[ext.pop()] == datum.data
        assert int(sample["cls"]) == datum.label
    with tarfile.open(f"{out}-000000.tar") as shard:
        names = shard.getnames()
    assert names[:3] == [f"{samples[0]['__key__']}.jpg", f"{samples[0]['__key__']}.cls",
                         f"{samples[0]['__key__']}.json"]  # fmt: skip


def test_shard_bytes_bound_each_shard(tmp_path: Path) -> None:
    db = _fashion_db(tmp_path, 300, encoded="png")
    out = tmp_path / "s"
    assert run("export", "--to", "webdataset", "--shard-bytes", 100_000, db, out).exit_code == 0
    manifest = json.loads(Path(f"{out}.shards.json").read_text())
    assert len(manifest["shards"]) > 3
    assert all(e["bytes"] <= 100_000 + 1024 for e in manifest["shards"])  # + the end marker
    assert sum(e["records"] for e in manifest["shards"]) == 300
    assert len(read_back(Path(f"{out}.shards.json"))) == 300


def test_existing_shards_need_resume_or_overwrite(tmp_path: Path) -> None:
    db = _fashion_db(tmp_path, 50)
    out = tmp_path / "s"
    assert run("export", "--to", "webdataset", "--shard-size", 20, db, out).exit_code == 0
    result = run("export", "--to", "webdataset", "--shard-size", 20, db, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out}.shards.json: already exists (use --resume to finish a killed export, or "
        "--overwrite to replace it)\n"
    )
    before = {p.name: p.read_bytes() for p in tmp_path.glob("s*")}
    assert (
        run("export", "--to", "webdataset", "--shard-size", 25, "--overwrite", db, out).exit_code
        == 0
    )
    after = sorted(p.name for p in tmp_path.glob("s*"))
    assert after == ["s-000000.tar", "s-000001.tar", "s.shards.json"]  # s-000002 removed
    assert len(before) == 4
    (tmp_path / "s-000007.tar").write_bytes(b"mine")
    result = run("export", "--to", "webdataset", "--overwrite", db, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path}/s-000007.tar: not listed in {out}.shards.json; refusing to replace "
        "it (--overwrite replaces only shards an export wrote)\n"
    )
    assert (tmp_path / "s-000007.tar").read_bytes() == b"mine"


def test_a_shard_is_never_written_into_the_database(tmp_path: Path) -> None:
    db = _fashion_db(tmp_path, 5)
    result = run("export", "--to", "webdataset", db, db / "s")
    assert result.exit_code == 1
    assert (
        result.stderr
        == f"Error: {db}/s.shards.json: is inside the input {db}; refusing to write there (write it somewhere else)\n"
    )
    assert sorted(p.name for p in db.iterdir()) == ["data.mdb", "lock.mdb", "mnist2db.json"]


def _kill_after(args: list[str], shard: Path) -> None:
    child = subprocess.Popen([sys.executable, "-m", "mnist2db", *args])
    try:
        deadline = time.monotonic() + 120
        while not shard.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        child.kill()
    finally:
        child.wait()
    assert child.returncode == -9, "finished before it could be killed"


def test_killed_export_resumes_shard_by_shard(tmp_path: Path) -> None:
    """SIGKILL once shard 2 is in place: --resume checks the shards listed and writes the rest, to
    the same bytes as an export never killed; no temporary is left."""
    db = _fashion_db(tmp_path, 10000)
    whole = tmp_path / "whole" / "s"
    assert run("export", "--to", "webdataset", "--shard-size", 200, db, whole).exit_code == 0
    out = tmp_path / "killed" / "s"
    args = ["export", "--to", "webdataset", "--shard-size", "200", "--quiet", str(db), str(out)]
    _kill_after(args, Path(f"{out}-000002.tar"))
    manifest = json.loads(Path(f"{out}.shards.json").read_text())
    assert not manifest["complete"] and 2 <= len(manifest["shards"]) < 50
    result = run("export", "--to", "webdataset", "--shard-size", 200, db, out)
    assert result.exit_code == 1 and "use --resume" in result.stderr
    result = run("export", "--to", "webdataset", "--shard-size", 100, "--resume", db, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out}.shards.json: written with shard_size 200, not 100; cannot resume it "
        "(use --overwrite to start again)\n"
    )
    result = run("export", "--to", "webdataset", "--shard-size", 200, "--resume", db, out)
    assert result.exit_code == 0, result.output
    assert (
        f"  {200 * len(manifest['shards'])} records were in the shards of the killed export"
        in result.stderr
    )
    assert Path(f"{out}.shards.json").read_bytes() == Path(f"{whole}.shards.json").read_bytes()
    for name in os.listdir(whole.parent):
        assert (out.parent / name).read_bytes() == (whole.parent / name).read_bytes(), name
    assert sorted(os.listdir(out.parent)) == sorted(os.listdir(whole.parent))  # no temporary


def test_killed_export_restarts_without_leftovers(tmp_path: Path) -> None:
    db = _fashion_db(tmp_path, 10000)
    out = tmp_path / "s"
    args = ["export", "--to", "webdataset", "--shard-size", "300", "--quiet", str(db), str(out)]
    _kill_after(args, Path(f"{out}-000001.tar"))
    from os_helpers import dead_pid

    # A killed run's temporary of a shard the restart does not write again: removed too.
    (tmp_path / f".s-000042.tar.mnist2db-tmp-{dead_pid()}-0a1b2c3d4e5f").write_bytes(b"part")
    result = run("export", "--to", "webdataset", "--shard-size", 5000, "--overwrite", db, out)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != db.name)
    assert names == ["s-000000.tar", "s-000001.tar", "s.shards.json"]  # no temporary left
    assert len(read_back(Path(f"{out}.shards.json"))) == 10000


def test_full_disk_leaves_no_partial_shard(tmp_path: Path) -> None:
    from os_helpers import mounted_tmpfs

    db = _fashion_db(tmp_path, 2000, encoded="png")
    with mounted_tmpfs(tmp_path / "small", "300k") as mount:
        result = run("export", "--to", "webdataset", "--shard-size", 100, db, mount / "s")
        assert result.exit_code == 1
        assert "No space left on device" in result.stderr and result.stderr.count("\n") == 1
        manifest = json.loads((mount / "s.shards.json").read_text())
        listed = {e["name"]: e["sha256"] for e in manifest["shards"]}
        found = {p.name for p in mount.iterdir()} - {"s.shards.json"}
        assert found == set(listed)  # complete shards only, each as the manifest says
        for name, digest in listed.items():
            assert hashlib.sha256((mount / name).read_bytes()).hexdigest() == digest


def test_colour_and_grey_raw_records(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    planes = rng.integers(0, 256, (3, 4, 6), dtype=np.uint8)
    db = write_raw_db(tmp_path / "db", "leveldb", {
        b"a": array_to_datum(planes, 1).SerializeToString(),
        b"b": array_to_datum(planes[:1], 2).SerializeToString(),
    })  # fmt: skip
    out = tmp_path / "s"
    assert run("export", "--to", "webdataset", db, out).exit_code == 0
    first, second = read_back(Path(f"{out}.shards.json"))
    assert np.array_equal(pixels(first["png"]), planes[::-1].transpose(1, 2, 0))  # RGB
    assert np.array_equal(pixels(second["png"]), planes[0])
    assert (int(first["cls"]), int(second["cls"])) == (1, 2)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 70000])
@pytest.mark.parametrize("name", ["00000000.png", "k.cls", "x" * 95 + ".json", "é.jpg"])
def test_members_are_the_bytes_tarfile_writes(name: str, size: int) -> None:
    from mnist2db.exporting.webdataset.tar_members import tar_member

    data = os.urandom(size)
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    expected = info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
    assert b"".join(tar_member(name, data)) == expected + data + b"\0" * (-size % 512)


def test_shards_split_greedily_by_records_and_bytes(tmp_path: Path) -> None:
    """Records of mixed sizes (some framed from where they lie, some joined): every shard
    holds as many samples as --shard-size and --shard-bytes allow, in key order, each member
    the bytes tarfile writes, each shard's SHA-256 the manifest's."""
    from mnist2db.datum_pb2 import Datum

    rng = np.random.default_rng(3)
    sizes = [int(s) for s in rng.choice([50, 700, 5000, 17000, 40000, 120000], 60)]
    images = [b"\x89PNG\r\n\x1a\n" + rng.bytes(size) for size in sizes]
    records = {
        b"%08d" % i: Datum(data=image, label=i % 7, encoded=True).SerializeToString()
        for i, image in enumerate(images)
    }
    db = write_raw_db(tmp_path / "db", "lmdb", records)
    out = tmp_path / "s"
    args = ("--shard-size", 7, "--shard-bytes", 150_000)
    assert run("export", "--to", "webdataset", *args, db, out).exit_code == 0
    manifest = json.loads(Path(f"{out}.shards.json").read_text())
    found: list[bytes] = []
    for entry in manifest["shards"]:
        shard = tmp_path / entry["name"]
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == entry["sha256"]
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
            found += [tar.extractfile(m).read() for m in members if m.name.endswith(".png")]
        assert entry["bytes"] == shard.stat().st_size
    assert found == images
    start = 0
    for n in [entry["records"] for entry in manifest["shards"]]:
        own = sum(_sample_size(s, i) for i, s in enumerate(sizes[start : start + n], start))
        assert n <= 7 and (n == 1 or own <= 150_000)
        if start + n < len(sizes) and n < 7:  # the next sample did not fit
            assert own + _sample_size(sizes[start + n], start + n) > 150_000
        start += n
    assert start == len(sizes)


def _sample_size(size: int, index: int) -> int:
    """A sample's bytes in a shard: the image member and the label member (header, data,
    padding each)."""
    label = len(b"%d" % (index % 7))
    return 512 + 512 * -(-size // 512) + 512 + 512 * -(-label // 512)


@pytest.mark.parametrize(
    "keys",
    [
        [b"%08d" % i for i in range(40)],  # plain, one length: the batch framed at once
        [b"a", b"bb-1", b"c_" * 40, b"9"],  # plain, of several lengths
        [b"00000000_x/a.jpg", b"k", b"k.2", b"\xff"],  # mapped: one sample at a time
    ],
)
@pytest.mark.parametrize("sizes", [(0, 1, 300, 511, 512, 513), (700, 20000, 5)])
def test_a_batch_is_framed_as_tarfile_frames_each_sample(keys: list[bytes], sizes: tuple) -> None:
    """batch_tars (its whole-batch path for plain keys, and its sample-by-sample one) gives
    the bytes tarfile writes for the same members, one after another."""
    from mnist2db.exporting.float_labels import sample_json
    from mnist2db.exporting.samples import SampleBatch, key_fields, sample_key
    from mnist2db.exporting.webdataset.tar_members import batch_tars

    data = [os.urandom(sizes[i % len(sizes)]) for i in range(len(keys))]
    labels = [i * 37 % 1000 for i in range(len(keys))]
    exts = ["png" if i % 3 else "jpg" for i in range(len(keys))]
    framed = batch_tars(SampleBatch(keys, labels, data, exts, False), "", 0)
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, label, piece, ext in zip(keys, labels, data, exts, strict=True):
            name, mapped = sample_key(key)
            members = [(f"{name}.{ext}", piece), (f"{name}.cls", b"%d" % label)]
            if mapped:
                members.append((f"{name}.json", sample_json(key_fields(key), label, None)))
            for member, content in members:
                info = tarfile.TarInfo(member)
                info.size, info.mode, info.mtime = len(content), 0o644, 0
                tar.addfile(info, io.BytesIO(content))
    got = b"".join(bytes(piece) for piece in framed.pieces(0, len(keys)))
    assert framed.offsets[-1] == len(got)
    assert framed.mapped == [sample_key(key)[1] for key in keys]
    assert got + b"\0" * (len(expected.getvalue()) - len(got)) == expected.getvalue()
