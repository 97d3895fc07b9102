"""convert_mnist_data: Caffe's command line, gflags spellings, usage, and the same bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnist2db.backends import detect_backend, open_reader
from mnist2db.compat import FlagError, parse_flags, run

ENTRY = [sys.executable, "-c", "from mnist2db.compat import main; main()"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend=leveldb", "a", "b", "c"],
        ["--backend", "leveldb", "a", "b", "c"],
        ["-backend=leveldb", "a", "b", "c"],
        ["-backend", "leveldb", "a", "b", "c"],
        ["a", "b", "c", "--backend=leveldb"],
        ["a", "--backend", "leveldb", "b", "c"],
        ["--logtostderr", "a", "b", "--v=2", "c", "-backend=leveldb", "--alsologtostderr=1"],
    ],
)
def test_gflags_spellings(argv: list[str]) -> None:
    parsed = parse_flags(argv)
    assert parsed.flags["backend"] == "leveldb"
    assert parsed.positional == ["a", "b", "c"]


def test_double_dash_ends_flags() -> None:
    parsed = parse_flags(["--", "-a", "b", "c"])
    assert parsed.positional == ["-a", "b", "c"]
    assert parsed.flags["backend"] == "lmdb"


def test_bool_and_int_flags() -> None:
    parsed = parse_flags(["--overwrite", "--batch_size=10", "a", "b", "c"])
    assert parsed.flags["overwrite"] is True and parsed.flags["batch_size"] == 10
    assert parse_flags(["--nooverwrite"]).flags["overwrite"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--colour=red"], "unknown command line flag 'colour'"),
        (["a", "b", "c", "--backend"], "flag '--backend' is missing its argument"),
        (["--batch_size=many"], "illegal value 'many' specified for int32 flag 'batch_size'"),
        (["--overwrite=maybe"], "illegal value 'maybe' specified for bool flag 'overwrite'"),
    ],
)
def test_flag_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as info:
        parse_flags(argv)
    assert str(info.value) == message


def test_wrong_argument_count_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["only", "two"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("convert_mnist_data: This script converts the MNIST dataset to\n")
    assert (
        "    convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file\n" in err
    )
    assert (
        '    -backend (The backend for storing the result) type: string\n      default: "lmdb"\n'
        in err
    )


def test_help_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"]) == 0
    out, err = capsys.readouterr()
    assert "Flags from examples/mnist/convert_mnist_data.cpp:" in out and err == ""


def test_unknown_flag_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--colour=red", "a", "b", "c"]) == 2
    assert capsys.readouterr().err == "ERROR: unknown command line flag 'colour'\n"


def test_unknown_backend_exit_1(
    mnist_pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    assert run(["--backend=rocksdb", str(ipath), str(lpath), str(tmp_path / "db")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("E")
    assert err.rstrip("\n").endswith("unknown backend 'rocksdb': expected one of lmdb, leveldb")
    assert err.count("\n") == 1
    assert not (tmp_path / "db").exists()


def test_same_bytes_as_mnist2db_convert(mnist_pair, tmp_path: Path) -> None:
    from mnist2db import convert

    ipath, lpath, *_ = mnist_pair(30, 6, 5)
    for backend in ("lmdb", "leveldb"):
        ours = tmp_path / f"ours_{backend}"
        caffe_style = tmp_path / f"compat_{backend}"
        convert(ipath, lpath, ours, backend=backend)
        done = subprocess.run(
            [*ENTRY, str(ipath), str(lpath), str(caffe_style), f"--backend={backend}"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
        logged = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
        assert logged == [
            f"Opened {backend} {caffe_style}",
            "A total of 30 items.",
            "Rows: 6 Cols: 5",
            "Processed 30 files.",
        ]
        assert detect_backend(caffe_style) == backend
        with open_reader(ours) as a, open_reader(caffe_style) as b:
            assert list(a) == list(b)


def test_error_is_one_line_exit_1(tmp_path: Path) -> None:
    (tmp_path / "labels").write_bytes(b"\0\0\x08\x01\0\0\0\0")
    done = subprocess.run(
        [*ENTRY, str(tmp_path / "missing"), str(tmp_path / "labels"), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.rstrip().endswith(f"] {tmp_path / 'missing'}: no such file")
    assert "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "db")


def test_minloglevel_silences_info(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    done = subprocess.run(
        [*ENTRY, "--minloglevel=1", str(ipath), str(lpath), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
