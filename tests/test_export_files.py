"""mnist2db export --to files: image files and a Caffe list back from a database
(mnist2db.exporting.image_files.folder), and the round trips through Caffe's convert_imageset.

tests/data/export holds an image tree, its list and digests.json: what Caffe's own
convert_imageset wrote from it ("made") and from our export of that database ("again"), for
each run and backend (make_corpus.py, with a real Caffe build; Caffe is not needed here).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from db_helpers import write_raw_db
from helpers import fashion_file
from PIL import Image

from mnist2db import array_to_datum, convert, export_files, iter_db
from mnist2db.caffe_tools.convert_imageset import convert_imageset
from mnist2db.cli.app import cli
from mnist2db.storage.databases.readers import open_reader

CORPUS = Path(__file__).parent / "data" / "export"
DIGESTS = json.loads((CORPUS / "digests.json").read_text(encoding="utf-8"))


def _read_db():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("export_corpus", CORPUS / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_db


read_db = _read_db()


def run(*args: object) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def records(db: Path) -> list[tuple[bytes, bytes]]:
    with open_reader(db) as reader:
        return [(bytes(k), bytes(v)) for k, v in reader]


RUNS = [(name, backend) for name in sorted(DIGESTS["runs"]) for backend in ("lmdb", "leveldb")]


@pytest.mark.parametrize(("name", "backend"), RUNS, ids=[f"{n}-{b}" for n, b in RUNS])
def test_caffe_round_trip(tmp_path: Path, capsys, name: str, backend: str) -> None:
    """Caffe's database -> export --to files -> convert_imageset: the records Caffe made
    again from our export (encoded: the same keys and values as the first database)."""
    run_ = DIGESTS["runs"][name]
    made = tmp_path / "made"
    code = convert_imageset([*run_["flags"], f"--backend={backend}", f"{CORPUS}/images/",
                             str(CORPUS / "list.txt"), str(made)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert read_db(str(made), backend) == run_[backend]["made"]  # Caffe's database, exactly
    out = tmp_path / "files"
    result = run("export", "--to", "files", made, out)
    assert result.exit_code == 0, result.output
    again = tmp_path / "again"
    code = convert_imageset([*run_["again_flags"], f"--backend={backend}", f"{out}/",
                             str(out / "list.txt"), str(again)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert read_db(str(again), backend) == run_[backend]["again"]
    if "--encoded" in run_["flags"]:
        assert run_[backend]["again"] == run_[backend]["made"]
        for key, value in records(made):  # each file holds the record's bytes as they are
            path = key.decode().split("_", 1)[1]
            datum = next(d for k, d in iter_db(made) if k == key)
            assert (
                hashlib.sha256((out / path).read_bytes()).digest()
                == hashlib.sha256(datum.data).digest()
            ), value[:0]
    else:  # raw: the same values in the same order, the keys naming the PNGs
        ordered = [run_[backend]["made"][k] for k in sorted(run_[backend]["made"])]
        assert [run_[backend]["again"][k] for k in sorted(run_[backend]["again"])] == ordered
        assert all(k.lower().endswith(".png") for k in run_[backend]["again"])


def test_corpus_covers_the_layouts() -> None:
    listed = (CORPUS / "list.txt").read_text(encoding="utf-8").splitlines()
    paths = [line.rsplit(" ", 1)[0] for line in listed]
    assert len(paths) != len(set(paths))  # an image listed twice
    assert any(" " in p for p in paths) and any(p.count("/") == 2 for p in paths)
    made = DIGESTS["runs"]["encoded"]["lmdb"]["made"]
    assert len(made) == len(paths) - 1  # broken.jpg skipped: a gap in the keys' numbers
    assert "00000002_broken.jpg" not in made


def test_export_lists_the_tree(tmp_path: Path, capsys) -> None:
    made = tmp_path / "made"
    assert convert_imageset(["--encoded", f"{CORPUS}/images/", str(CORPUS / "list.txt"),
                             str(made)]) == 0  # fmt: skip
    out = tmp_path / "files"
    result = run("export", "--to", "files", made, out)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"Wrote {out}: 7 records as 7 files, {_size(out)} bytes (7 stored bytes as they are, "
        "0 raw as PNG), and list.txt.",
        "  7 at the paths of their convert_imageset keys",
    ]
    assert (out / "list.txt").read_text().splitlines() == [
        "cat/tabby.jpg 0", "cat/grey.png 0", ".skipped/2 0", "dog/puppy/small.png 1",
        "dog/big dog.jpg 1", "bird.bmp 2", "cat/tabby.jpg 3", "mixed/UPPER.PNG 2",
    ]  # fmt: skip
    marker = json.loads((out / "export.json").read_text())
    assert (marker["records"], marker["restored"], marker["shared"]) == (7, 6, 1)
    assert not (out / ".skipped").exists()


def _size(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "export.json")


def _fashion_db(tmp_path: Path, count: int, **options: object) -> Path:
    images = fashion_file("t10k-images-idx3-ubyte")
    labels = fashion_file("t10k-labels-idx1-ubyte")
    db = tmp_path / "fashion_lmdb"
    convert(images, labels, db, count=count, **options)
    return db


@pytest.mark.parametrize("encoded", [None, "png"])
def test_fashion_round_trip_through_imageset(tmp_path: Path, encoded: str | None) -> None:
    """Fashion-MNIST's database -> files -> mnist2db imageset --gray: the same pixels and
    labels, record for record."""
    db = _fashion_db(tmp_path, 1500, encoded=encoded)
    out = tmp_path / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 0, result.output
    lines = (out / "list.txt").read_text().splitlines()
    assert lines[:2] == [f"{lines[0].split('/')[0]}/00000000.png {lines[0].split('/')[0]}",
                         lines[1]]  # fmt: skip
    again = tmp_path / "again"
    result = run("imageset", "--list", out / "list.txt", "--gray", "--quiet", out, again)
    assert result.exit_code == 0, result.output
    first, second = records(db), records(again)
    assert len(first) == len(second) == 1500
    if encoded is None:  # Caffe's records, but for convert_imageset's "encoded: false"
        assert [v + b"\x38\x00" for _, v in first] == [v for _, v in second]
    else:
        for (_, datum), (_, back) in zip(iter_db(db), iter_db(again), strict=True):
            assert back.label == datum.label
            assert Image.open(__import__("io").BytesIO(datum.data)).tobytes() == back.data
    for (key, datum), line in zip(iter_db(db), lines, strict=True):
        path, label = line.rsplit(" ", 1)
        assert int(label) == datum.label and path == f"{datum.label}/{key.decode()}.png"
        if encoded:  # the stored PNG, as it is
            assert (out / path).read_bytes() == datum.data


def test_colour_records_become_rgb_pngs(tmp_path: Path, backend: str) -> None:
    rng = np.random.default_rng(3)
    planes = rng.integers(0, 256, (3, 5, 7), dtype=np.uint8)  # Caffe's B, G, R planes
    grey = rng.integers(0, 256, (1, 4, 6), dtype=np.uint8)
    db = write_raw_db(tmp_path / "db", backend, {
        b"colour": array_to_datum(planes, 4).SerializeToString(),
        b"grey": array_to_datum(grey, 5).SerializeToString(),
    })  # fmt: skip
    out = tmp_path / "files"
    assert run("export", "--to", "files", db, out).exit_code == 0
    with Image.open(out / "4" / "colour.png") as picture:
        assert picture.mode == "RGB"
        assert np.array_equal(np.asarray(picture), planes[::-1].transpose(1, 2, 0))
    with Image.open(out / "5" / "grey.png") as picture:
        assert picture.mode == "L" and np.array_equal(np.asarray(picture), grey[0])
    assert (out / "list.txt").read_text() == "4/colour.png 4\n5/grey.png 5\n"


def test_other_channel_counts_are_refused(tmp_path: Path) -> None:
    db = write_raw_db(tmp_path / "db", "lmdb", {
        b"k": array_to_datum(np.zeros((4, 2, 2), np.uint8), 1).SerializeToString()
    })  # fmt: skip
    out = tmp_path / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {db}: key k: Datum 4 × 2 × 2: an image file holds 1 channel (grey) or 3 "
        "(colour) of at least 1 × 1 pixels\n"
    )
    assert not out.exists() and os.listdir(tmp_path) == ["db"]


UNSAFE = [
    b"00000000_../escape.jpg", b"00000001_/etc/absolute.jpg", b"00000002_a/../../up.jpg",
    b"00000003_nul\x00.jpg", b"00000004_\xff\xfe.jpg", b"00000005_" + b"x" * 300 + b".jpg",
    b"00000006_list.txt", b"00000007_a//b.jpg", b"00000008_new\nline.jpg", b"../key",
    b".hidden", b"k\xffey",
]  # fmt: skip


def test_unsafe_keys_get_safe_names(tmp_path: Path, backend: str) -> None:
    jpeg = (CORPUS / "images" / "cat" / "tabby.jpg").read_bytes()
    datum = array_to_datum(np.zeros((1, 1, 1), np.uint8), 2)
    datum.ClearField("channels"), datum.ClearField("height"), datum.ClearField("width")
    datum.data, datum.encoded = jpeg, True
    db = write_raw_db(tmp_path / "db", backend, dict.fromkeys(UNSAFE, datum.SerializeToString()))
    out = tmp_path / "deep" / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 0, result.output
    assert f"  {len(UNSAFE)} keys not safe as paths, renamed (renamed.tsv): " in result.stderr
    listed = [line.rsplit(" ", 1) for line in (out / "list.txt").read_text().splitlines()]
    assert len(listed) == len(UNSAFE) and all(label == "2" for _, label in listed)
    for path, _ in listed:
        assert path.startswith("2/") and path.endswith(".jpg") and path.count("/") == 1
        assert (out / path).read_bytes() == jpeg
    rows = (out / "renamed.tsv").read_text().splitlines()
    assert rows[0] == "path\tkey_hex\tkey"
    assert sorted(bytes.fromhex(r.split("\t")[1]) for r in rows[1:]) == sorted(UNSAFE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "deep"]  # nothing outside
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["files"]


def test_existing_out_needs_overwrite_and_must_be_an_export(tmp_path: Path) -> None:
    db = _small_db(tmp_path)
    out = tmp_path / "files"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {out}: already exists (use --overwrite to replace it)\n"
    result = run("export", "--to", "files", "--overwrite", db, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out}: holds no export.json of an export; refusing to replace it "
        "(--overwrite replaces only an export)\n"
    )
    assert (out / "mine.txt").read_text() == "keep me"
    (out / "mine.txt").unlink()
    out.rmdir()
    assert run("export", "--to", "files", db, out).exit_code == 0
    assert run("export", "--to", "files", "--overwrite", db, out).exit_code == 0
    (out / "3").mkdir(exist_ok=True)
    (out / "3" / "added.png").write_bytes(b"x")
    result = run("export", "--to", "files", "--overwrite", db, out)
    assert result.exit_code == 1
    assert "(files added or changed since); refusing to replace it" in result.stderr
    assert (out / "3" / "added.png").read_bytes() == b"x"
    (out / "3" / "added.png").unlink()
    assert run("export", "--to", "files", "--overwrite", db, out).exit_code == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _small_db(tmp_path: Path, count: int = 12) -> Path:
    rng = np.random.default_rng(0)
    db = tmp_path / "small_lmdb"
    convert_images = rng.integers(0, 256, (count, 1, 3, 4), dtype=np.uint8)
    write_raw_db(db, "lmdb", {
        b"%08d" % i: array_to_datum(image, i % 4).SerializeToString()
        for i, image in enumerate(convert_images)
    })  # fmt: skip
    return db


def test_out_is_never_on_the_input(tmp_path: Path) -> None:
    db = _small_db(tmp_path)
    for out in (db, db / "inside"):
        result = run("export", "--to", "files", "--overwrite", db, out)
        assert result.exit_code == 1, out
        assert "refusing" in result.stderr and result.stderr.count("\n") == 1
    assert sorted(p.name for p in db.iterdir()) == ["data.mdb", "lock.mdb"]


def test_class_names_beside_the_database(tmp_path: Path) -> None:
    db = _small_db(tmp_path)
    Path(f"{db}.classes.txt").write_text("zero\none\ntwo\nthree\n")
    out = tmp_path / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 0, result.output
    assert (out / "classes.txt").read_text() == "zero\none\ntwo\nthree\n"
    assert "  4 class names in classes.txt" in result.stderr


def test_class_names_in_the_shards_manifest(tmp_path: Path) -> None:
    db = _small_db(tmp_path)
    Path(f"{db}.classes.txt").write_text("zero\none\ntwo\nthree\n")
    result = run("export", "--to", "webdataset", db, tmp_path / "shards")
    assert result.exit_code == 0, result.output
    manifest = tmp_path / "shards.shards.json"
    assert json.loads(manifest.read_text())["classes"] == ["zero", "one", "two", "three"]
    assert f"  4 class names in {manifest}" in result.stderr
    # An explicit --classes wins over the file beside the database.
    names = tmp_path / "names.txt"
    names.write_text("a\nb\nc\nd\n")
    result = run("export", "--to", "webdataset", "--overwrite", "--classes", names, db,
                 tmp_path / "shards")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(manifest.read_text())["classes"] == ["a", "b", "c", "d"]


def test_full_disk_leaves_nothing(tmp_path: Path) -> None:
    from os_helpers import mounted_tmpfs

    db = _fashion_db(tmp_path, 3000, encoded="png")
    with mounted_tmpfs(tmp_path / "small", "200k") as mount:
        result = run("export", "--to", "files", db, mount / "files")
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: {mount}/files/")
        assert "No space left on device" in result.stderr
        assert os.listdir(mount) == []


def test_killed_export_leaves_no_out(tmp_path: Path) -> None:
    """SIGKILL half-way: no OUT; the next export removes the dead run's staging."""
    db = _fashion_db(tmp_path, 10000)
    out = tmp_path / "files"
    child = subprocess.Popen([sys.executable, "-m", "mnist2db", "export", "--to", "files",
                              "--quiet", str(db), str(out)])  # fmt: skip
    try:
        staged: list[Path] = []
        while not any(p.rglob("*.png") for p in staged) and child.poll() is None:
            staged = [p for p in tmp_path.iterdir() if p.name.startswith(".files.")]
        child.kill()
    finally:
        child.wait()
    assert child.returncode == -9, "finished before it could be killed"
    assert not out.exists() and len(staged) == 1
    assert run("export", "--to", "files", db, out).exit_code == 0
    assert not staged[0].exists()
    assert len((out / "list.txt").read_text().splitlines()) == 10000


@pytest.mark.parametrize("to", ["files", "webdataset"])
def test_peak_memory_is_bounded(tmp_path: Path, to: str) -> None:
    """Records of 8 MiB each, 192 MiB in all: the export's own memory (anonymous, sampled
    every millisecond) stays under 128 MiB, with its threads reading ahead and writing
    behind. (The resident pages of LMDB's map of the database file are the page cache's,
    clean, and are not counted.)"""
    blob = (CORPUS / "images" / "cat" / "tabby.jpg").read_bytes()
    datum = array_to_datum(np.zeros((1, 1, 1), np.uint8), 0)
    datum.data = blob + os.urandom((8 << 20) - len(blob))
    datum.encoded = True
    import lmdb

    env = lmdb.open(str(tmp_path / "big"), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(24):
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()
    code = (
        "import re, sys, threading, time\n"
        "from mnist2db.exporting.image_files.folder import export_files\n"
        "from mnist2db.exporting.webdataset.shards import export_webdataset\n"
        "peak, done = [0], []\n"
        "def sample():\n"
        "    while not done:\n"
        "        status = open('/proc/self/status').read()\n"
        "        peak[0] = max(peak[0], int(re.search(r'RssAnon:\\s+(\\d+)', status)[1]))\n"
        "        time.sleep(0.001)\n"
        "thread = threading.Thread(target=sample)\n"
        "thread.start()\n"
        "(export_files if sys.argv[3] == 'files' else export_webdataset)(sys.argv[1], sys.argv[2])\n"
        "done.append(1)\n"
        "thread.join()\n"
        "print(peak[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "big"),
                           str(tmp_path / "out" / "s"), to], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert 0 < int(done.stdout) < 128 * 1024, f"peak anonymous memory {done.stdout} KiB"
    if to == "files":
        assert len(list((tmp_path / "out" / "s" / "0").iterdir())) == 24
    else:
        manifest = json.loads((tmp_path / "out" / "s.shards.json").read_text())
        assert manifest["complete"] and manifest["records"] == 24


def test_mixed_encodings_keep_key_order(tmp_path: Path, backend: str) -> None:
    """Raw grey, raw colour, JPEG and PNG records interleaved: each file as its kind says,
    the list in key order."""
    rng = np.random.default_rng(9)
    jpeg = (CORPUS / "images" / "cat" / "tabby.jpg").read_bytes()
    png = (CORPUS / "images" / "cat" / "grey.png").read_bytes()

    def encoded(data: bytes, label: int) -> bytes:
        datum = array_to_datum(np.zeros((1, 1, 1), np.uint8), label)
        datum.ClearField("channels"), datum.ClearField("height"), datum.ClearField("width")
        datum.data, datum.encoded = data, True
        return datum.SerializeToString()

    grey = [rng.integers(0, 256, (1, 3, 4), dtype=np.uint8) for _ in range(3)]
    colour = rng.integers(0, 256, (3, 2, 5), dtype=np.uint8)
    db = write_raw_db(tmp_path / "db", backend, {
        b"a0": array_to_datum(grey[0], 0).SerializeToString(),
        b"a1": encoded(jpeg, 1),
        b"a2": array_to_datum(grey[1], 2).SerializeToString(),
        b"a3": array_to_datum(colour, 3).SerializeToString(),
        b"a4": encoded(png, 4),
        b"a5": array_to_datum(grey[2], 5).SerializeToString(),
    })  # fmt: skip
    out = tmp_path / "files"
    result = run("export", "--to", "files", db, out)
    assert result.exit_code == 0, result.output
    assert "(2 stored bytes as they are, 4 raw as PNG)" in result.stderr
    assert (out / "list.txt").read_text().splitlines() == [
        "0/a0.png 0", "1/a1.jpg 1", "2/a2.png 2", "3/a3.png 3", "4/a4.png 4", "5/a5.png 5",
    ]  # fmt: skip
    assert (out / "1/a1.jpg").read_bytes() == jpeg and (out / "4/a4.png").read_bytes() == png
    for name, planes in (("0/a0.png", grey[0]), ("2/a2.png", grey[1]), ("5/a5.png", grey[2])):
        assert np.array_equal(np.asarray(Image.open(out / name)), planes[0])
    assert np.array_equal(np.asarray(Image.open(out / "3/a3.png")), colour[::-1].transpose(1, 2, 0))


def test_a_name_shared_by_equal_bytes_only(tmp_path: Path) -> None:
    """Records naming one path: those holding its bytes share the file, one holding other
    bytes of the same size (or another size) gets a name of its own; and the check of a
    file already there opens no link, no FIFO (it would wait), no directory."""
    from mnist2db.exporting.image_files.folder import _holds

    def encoded(data: bytes, label: int) -> bytes:
        datum = array_to_datum(np.zeros((1, 1, 1), np.uint8), label)
        datum.ClearField("channels"), datum.ClearField("height"), datum.ClearField("width")
        datum.data, datum.encoded = data, True
        return datum.SerializeToString()

    db = write_raw_db(tmp_path / "db", "lmdb", {
        b"00000000_a.bin": encoded(b"same bytes", 0),
        b"00000001_a.bin": encoded(b"same bytes", 1),
        b"00000002_a.bin": encoded(b"SAME BYTES", 2),
        b"00000003_a.bin": encoded(b"same", 3),
    })  # fmt: skip
    out = tmp_path / "files"
    result = export_files(db, out)
    assert (result.restored, result.shared, result.mapped) == (1, 1, 2)
    lines = (out / "list.txt").read_text().splitlines()
    assert lines[:2] == ["a.bin 0", "a.bin 1"]
    assert (out / lines[2].split()[0]).read_bytes() == b"SAME BYTES"
    assert (out / lines[3].split()[0]).read_bytes() == b"same"

    (tmp_path / "file").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    assert _holds(str(tmp_path / "file"), b"data")
    assert _holds(str(tmp_path / "file"), memoryview(b"data"))
    assert not _holds(str(tmp_path / "file"), b"dat!")
    assert not _holds(str(tmp_path / "file"), b"data and more")
    for other in ("link", "fifo", "dir", "missing"):
        assert not _holds(str(tmp_path / other), b"data"), other
