"""convert_imageset's command line, log lines and refusals (the records: see
test_convert_imageset_corpus.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mnist2db.caffe_tools.convert_imageset import convert_imageset

ENTRY = [sys.executable, "-c", "from mnist2db.caffe_tools.convert_imageset import main; main()"]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (5, 7), dtype=np.uint8)).save(root / f"{i}.png")
    Image.fromarray(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)).save(root / "big.png")
    return root


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, check=False, cwd=cwd)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("E")
    return last.split("] ", 1)[1]


def records(path: Path) -> list[bytes]:
    import lmdb

    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        return [bytes(key) for key, _ in txn.cursor()]


def test_caffe_log_lines_and_a_skipped_image(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\nnope.png 2\n1.png 3\n")
    done = run(["imgs/", "list.txt", "db"], tmp_path)
    assert done.returncode == 0, done.stderr
    *messages, decoders, rate = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    assert re.fullmatch(r"Wrote 2 records in \d+\.\d\d s \(\d+ images/s\)\.", rate)
    assert decoders.startswith("decoding with ")  # tests/images/test_decoder_note.py
    assert messages == [
        "A total of 3 images.",
        "Opened lmdb db",
        "Could not open or find file imgs/nope.png: cannot read it: No such file or directory",
        "Processed 2 files.",
        "Skipped 1 of 3 images that could not be read (their keys are left out, as Caffe "
        "leaves them).",
    ]
    assert records(tmp_path / "db") == [b"00000000_0.png", b"00000002_1.png"]


def test_root_without_slash_is_refused(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\n")
    done = run(["imgs", "list.txt", "db"], tmp_path)
    assert error_line(done) == (
        "imgs: the root folder does not end with '/': Caffe joins it to each path as text "
        "(imgs0.png, which does not exist); write imgs/"
    )
    assert not (tmp_path / "db").exists()


def test_no_image_read_writes_nothing(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("a.png 1\nb.png 2\n")
    done = run(["imgs/", "list.txt", "db"], tmp_path)
    assert error_line(done) == (
        "list.txt: no image could be read (the first: imgs/a.png: cannot read it: No such file "
        "or directory); nothing written"
    )
    assert sorted(os.listdir(tmp_path)) == ["imgs", "list.txt"]


def test_existing_output_is_refused_then_replaced_with_overwrite(
    images: Path, tmp_path: Path
) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\n")
    assert run(["imgs/", "list.txt", "db"], tmp_path).returncode == 0
    assert error_line(run(["imgs/", "list.txt", "db"], tmp_path)) == (
        "db: already exists (use --overwrite to replace it)"
    )
    (tmp_path / "list.txt").write_text("1.png 1\n")
    assert run(["--overwrite", "imgs/", "list.txt", "db"], tmp_path).returncode == 0
    assert records(tmp_path / "db") == [b"00000000_1.png"]


def test_lmdb_key_limit_is_refused_up_front(images: Path, tmp_path: Path) -> None:
    long = "d" * 250 + "/" + "e" * 250 + ".png"
    (images / long).parent.mkdir()
    shutil.copy(images / "0.png", images / long)
    (tmp_path / "list.txt").write_text(f"0.png 1\n{long} 2\n")
    assert error_line(run(["imgs/", "list.txt", "db"], tmp_path)) == (
        f"list.txt:2: the key 00000001_{'d' * 31}… is 514 bytes; LMDB keys hold at most 511 "
        "(shorten the path, or use --backend leveldb)"
    )
    assert not (tmp_path / "db").exists()
    assert run(["--backend=leveldb", "imgs/", "list.txt", "db"], tmp_path).returncode == 0


def test_check_size_refuses_the_first_other_size(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\n1.png 1\nbig.png 2\n")
    assert error_line(run(["--check_size", "imgs/", "list.txt", "db"], tmp_path)) == (
        "list.txt:3: big.png is 3 × 6 × 7, the first image (0.png) 3 × 5 × 7 "
        "(--check_size: every image one size; or give a resize)"
    )
    assert sorted(os.listdir(tmp_path)) == ["imgs", "list.txt"]
    assert run(["--check_size", "--resize_width=4", "--resize_height=4", "imgs/", "list.txt", "db"],
               tmp_path).returncode == 0  # fmt: skip


def test_a_type_that_cannot_be_encoded_is_refused(images: Path, tmp_path: Path) -> None:
    Image.open(images / "0.png").save(images / "x.tif")
    (tmp_path / "list.txt").write_text("0.png 1\nx.tif 2\n")
    args = ["--encoded", "--resize_width=3", "--resize_height=3", "imgs/", "list.txt", "db"]
    assert error_line(run(args, tmp_path)) == (
        "list.txt:2: x.tif: cannot encode as 'tif' (written as Caffe writes them: png, jpg, "
        "jpeg, jpe, bmp, dib); give --encode_type"
    )
    assert error_line(run(["--encode_type=gif", "imgs/", "list.txt", "db"], tmp_path)) == (
        "cannot encode images as 'gif': the types written as Caffe writes them are png, jpg, "
        "jpeg, jpe, bmp, dib"
    )
    # Not resized, a .tif is stored as it is, as Caffe stores it.
    assert run(["--encoded", "imgs/", "list.txt", "db"], tmp_path).returncode == 0


def test_a_bad_list_line_is_named(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\n1.png one\n")
    assert error_line(run(["imgs/", "list.txt", "db"], tmp_path)) == (
        "list.txt:2: the label 'one' is not a whole number: each line is 'PATH LABEL', the "
        "label last"
    )


def test_tabs_and_trailing_spaces_are_read_as_meant(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_bytes(b"0.png\t1\r\n1.png 2 \n2.png  3\n")
    assert run(["imgs/", "list.txt", "db"], tmp_path).returncode == 0
    assert records(tmp_path / "db") == [b"00000000_0.png", b"00000001_1.png", b"00000002_2.png"]


def test_seeded_shuffle_repeats(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("".join(f"{i}.png {i}\n" for i in range(3)))
    first = run(["--shuffle", "--seed=5", "imgs/", "list.txt", "a"], tmp_path)
    assert "Shuffled with seed 5 (--seed=5 repeats it)." in first.stderr
    assert run(["--shuffle", "--seed=5", "imgs/", "list.txt", "b"], tmp_path).returncode == 0
    assert records(tmp_path / "a") == records(tmp_path / "b")
    assert sorted(k[9:] for k in records(tmp_path / "a")) == [b"0.png", b"1.png", b"2.png"]
    assert [k[:9] for k in records(tmp_path / "a")] == [b"00000000_", b"00000001_", b"00000002_"]


def test_wrong_argument_count_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert convert_imageset(["a", "b"]) == 2
    assert "convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME" in capsys.readouterr().err


def test_one_resize_flag_alone_is_a_warning(images: Path, tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("0.png 1\n")
    done = run(["--resize_width=3", "imgs/", "list.txt", "db"], tmp_path)
    assert done.returncode == 0
    assert "only one of --resize_width and --resize_height given: no resize" in done.stderr


@pytest.mark.parametrize("shuffle", [[], ["--shuffle", "--seed=1"]], ids=["listed", "shuffled"])
def test_a_refused_target_is_refused_before_opened(
    images: Path, tmp_path: Path, shuffle: list[str]
) -> None:
    """Caffe's convert_imageset logs "Shuffling data" and "A total of N images.", then fails
    opening the database (mkdir), before its "Opened" line: so does the drop-in."""
    (tmp_path / "list.txt").write_text("0.png 1\n1.png 2\n")
    (tmp_path / "db").mkdir()
    done = run([*shuffle, "imgs/", "list.txt", "nodir/../db"], tmp_path)
    assert done.returncode == 1
    messages = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    assert messages == [
        *(["Shuffling data", "Shuffled with seed 1 (--seed=1 repeats it)."] if shuffle else []),
        "A total of 2 images.",
        "nodir/../db: no directory nodir/.. to write it in (nodir does not exist, and '..' "
        "after it would leave it again: create it first, or name the path without '..')",
    ]
    done = run([*shuffle, "imgs/", "list.txt", "db"], tmp_path)
    messages = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    assert messages[-2:] == [
        "A total of 2 images.",
        "db: already exists (use --overwrite to replace it)",
    ]
    assert os.listdir(tmp_path / "db") == []
    assert sorted(os.listdir(tmp_path)) == ["db", "imgs", "list.txt"]
