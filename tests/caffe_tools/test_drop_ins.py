"""convert_mnist_data: Caffe's command line, gflags spellings, usage, and the same bytes."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnist2db.caffe_tools.drop_ins import parse_flags, run
from mnist2db.caffe_tools.gflags import FlagError
from mnist2db.storage.databases.backends import detect_backend
from mnist2db.storage.databases.readers import open_reader

ENTRY = [sys.executable, "-c", "from mnist2db.caffe_tools.drop_ins import main; main()"]


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
    assert parsed["backend"] == "leveldb"
    assert parsed.positional == ["a", "b", "c"]


def test_double_dash_ends_flags() -> None:
    parsed = parse_flags(["--", "-a", "b", "c"])
    assert parsed.positional == ["-a", "b", "c"]
    assert parsed["backend"] == "lmdb"


def test_bool_and_int_flags() -> None:
    parsed = parse_flags(["--overwrite", "--batch_size=10", "a", "b", "c"])
    assert parsed["overwrite"] is True and parsed["batch_size"] == 10
    assert parse_flags(["--nooverwrite"])["overwrite"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--colour=red"], "ERROR: unknown command line flag 'colour'"),
        (
            ["a", "b", "c", "--backend"],
            "ERROR: flag '--backend' is missing its argument; "
            "flag description: The backend for storing the result",
        ),
        (
            ["--batch_size=many"],
            "ERROR: illegal value 'many' specified for int32 flag 'batch_size'",
        ),
        (["--overwrite=maybe"], "ERROR: illegal value 'maybe' specified for bool flag 'overwrite'"),
        # int32 range, as gflags' strtoll then static_cast<int32> check
        (
            ["--batch_size=2147483648"],
            "ERROR: illegal value '2147483648' specified for int32 flag 'batch_size'",
        ),
        (["--batch_size=10 "], "ERROR: illegal value '10 ' specified for int32 flag 'batch_size'"),
        (["--batch_size="], "ERROR: illegal value '' specified for int32 flag 'batch_size'"),
        (["--batch_size=0"], "ERROR: failed validation of new value '0' for flag 'batch_size'"),
        (
            ["--max_log_size=-1"],
            "ERROR: illegal value '-1' specified for uint32 flag 'max_log_size'",
        ),
        (
            ["--logtostderr=maybe"],
            "ERROR: illegal value 'maybe' specified for bool flag 'logtostderr'",
        ),
        (["--v=x"], "ERROR: illegal value 'x' specified for int32 flag 'v'"),
        (
            ["--nobackend"],
            "ERROR: boolean value (nobackend) specified for string command line flag",
        ),
        # every error at once, in flag-name order, as gflags' error map reports them
        (
            ["--zeta", "--alpha=1", "--batch_size=x"],
            "ERROR: unknown command line flag 'alpha'\n"
            "ERROR: illegal value 'x' specified for int32 flag 'batch_size'\n"
            "ERROR: unknown command line flag 'zeta'",
        ),
    ],
)
def test_flag_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as info:
        parse_flags(argv)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2147483647", 2147483647),
        ("-2147483648", -2147483648),
        ("0x10", 16),
        ("0X1f", 31),
        (" 12", 12),
        ("+7", 7),
        ("010", 10),  # a leading 0 is not octal in gflags
    ],
)
def test_int32_values_as_strtoll(value: str, expected: int) -> None:
    from mnist2db.caffe_tools.gflags import parse_value

    assert parse_value("int32", value) == expected


def test_glog_and_gflags_flags_are_accepted() -> None:
    parsed = parse_flags(
        [
            "--logtostderr=false",
            "--max_log_size=10",
            "--minloglevel=1",
            "--v=2",
            "--log_dir=/tmp",
            "--undefok=colour,verbose",
            "--colour=red",
            "--noverbose",
            "a",
            "b",
            "c",
        ]
    )
    assert parsed["logtostderr"] is False and parsed["max_log_size"] == 10
    assert parsed["minloglevel"] == 1 and parsed["v"] == 2
    assert parsed.positional == ["a", "b", "c"]


def test_undefok_flag_given_a_separate_value_leaves_it_as_an_argument() -> None:
    # gflags cannot know that an undefined flag takes a value: "red" is an argument.
    parsed = parse_flags(["--undefok=colour", "--colour", "red", "a", "b"])
    assert parsed.positional == ["red", "a", "b"]


def test_nox_with_a_value_is_false_as_in_gflags() -> None:
    assert parse_flags(["--overwrite", "--nooverwrite=true"])["overwrite"] is False


def test_dashes_match_underscores() -> None:
    assert parse_flags(["--batch-size=7"])["batch_size"] == 7


def test_double_dash_permutes_as_gflags() -> None:
    # gflags moves arguments seen before "--" behind those after it.
    assert parse_flags(["a", "--", "-b", "c"]).positional == ["-b", "c", "a"]


def test_flagfile(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.write_text(
        "# a comment\n"
        "--backend=leveldb\n"
        "  --batch_size=64\n"
        "--unknown_in_file=1\n"
        "other_program\n"
        "--overwrite\n"
        "convert_*\n"
        "--minloglevel=2\n"
    )
    parsed = parse_flags([f"--flagfile={flags}", "a", "b", "c"])
    assert parsed["backend"] == "leveldb" and parsed["batch_size"] == 64
    assert parsed["overwrite"] is False  # that section was for another program
    assert parsed["minloglevel"] == 2  # "convert_*" matches convert_mnist_data
    # A later flag on the command line wins.
    assert parse_flags([f"--flagfile={flags}", "--backend=lmdb"])["backend"] == "lmdb"


def test_flagfile_illegal_value_is_an_error(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.write_text("--batch_size=3000000000\n")
    with pytest.raises(FlagError, match="illegal value '3000000000' specified for int32"):
        parse_flags([f"--flagfile={flags}"])


def test_flagfile_including_itself_is_one_error(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.write_text(f"--flagfile={flags}\n")
    with pytest.raises(FlagError) as info:
        parse_flags([f"--flagfile={flags}"])
    assert str(info.value) == f"ERROR: flagfile '{flags}' includes itself"


def test_missing_flagfile_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([f"--flagfile={tmp_path / 'nope'}", "a", "b", "c"]) == 1
    assert capsys.readouterr().err == f"{tmp_path / 'nope'}: No such file or directory\n"


def test_fromenv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGS_backend", "leveldb")
    assert parse_flags(["--fromenv=backend"])["backend"] == "leveldb"
    with pytest.raises(FlagError, match="ERROR: FLAGS_batch_size not found in environment"):
        parse_flags(["--fromenv=batch_size"])
    assert parse_flags(["--tryfromenv=batch_size"])["batch_size"] == 1000


def test_glog_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOG_minloglevel", "2")
    monkeypatch.setenv("GLOG_logtostderr", "yes")
    parsed = parse_flags([])
    assert parsed["minloglevel"] == 2 and parsed["logtostderr"] is True
    assert parse_flags(["--minloglevel=0"])["minloglevel"] == 0  # the flag wins


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
    # --help wins over flag errors, as in gflags.
    assert run(["--help", "--colour=red"]) == 0
    out, err = capsys.readouterr()
    assert "Flags from examples/mnist/convert_mnist_data.cpp:" in out and err == ""


def test_flag_error_exits_1_as_gflags(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--colour=red", "a", "b", "c"]) == 1
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


def test_caffe_lines_come_before_the_records(mnist_pair, tmp_path: Path) -> None:
    """Opened/A total/Rows are logged before the first record, as Caffe logs them: the
    staging checkpoint (reached before anything is written) prints a marker."""
    ipath, lpath, *_ = mnist_pair(5)
    code = (
        "import sys, mnist2db.storage.files as c, mnist2db.caffe_tools.drop_ins as compat\n"
        "c.checkpoint = lambda stage, staging: sys.stderr.write(f'<{stage}>\\n')\n"
        "sys.argv = ['convert_mnist_data', *sys.argv[1:]]\n"
        "compat.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ipath), str(lpath), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split("] ", 1)[-1] for line in done.stderr.splitlines()]
    assert lines == [
        f"Opened lmdb {tmp_path / 'db'}",
        "A total of 5 items.",
        "Rows: 28 Cols: 28",
        "<staging>",
        "<staged>",
        "<placed>",
        "Processed 5 files.",
    ]


def test_glog_prefix_and_flags(mnist_pair, tmp_path: Path) -> None:
    import re

    ipath, lpath, *_ = mnist_pair(2)
    done = subprocess.run(
        [*ENTRY, str(ipath), str(lpath), str(tmp_path / "a")],
        capture_output=True,
        text=True,
        check=False,
    )
    first = done.stderr.splitlines()[1]
    assert re.fullmatch(
        r"I\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ convert_mnist_data\.cpp:88\] A total of 2 items\.",
        first,
    ), first
    # --log_prefix=false: bare messages; --alsologtostderr=false: INFO goes to glog's log
    # files only (the drop-in writes none), so nothing on stderr.
    done = subprocess.run(
        [*ENTRY, "--log_prefix=false", str(ipath), str(lpath), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stderr.splitlines()[1] == "A total of 2 items."
    done = subprocess.run(
        [*ENTRY, "--alsologtostderr=false", str(ipath), str(lpath), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "c" / "data.mdb").exists()


# -- pipes: the same early checks as for files ----------------------------------------------


def _piped(args: list[str], data: bytes, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*ENTRY, *args], input=data, capture_output=True, cwd=cwd, check=False, timeout=60
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_a_piped_idx2_int_label_file_is_refused_as_caffe_refuses_it(
    mnist_pair, tmp_path: Path
) -> None:
    # Caffe's reader takes only magic 2049 labels; a QMNIST idx2-int file through
    # /dev/stdin must be refused as the same file on disk is, before anything is written.
    import gzip

    from helpers import write_idx

    images, _, _, _ = mnist_pair(4, 3, 3)
    rows = write_idx(tmp_path / "q-labels-idx2-int", np.zeros((4, 8), dtype=">i4"))
    for data in (rows.read_bytes(), gzip.compress(rows.read_bytes())):
        done = _piped([str(images), "/dev/stdin", "db"], data, tmp_path)
        assert done.returncode == 1
        assert done.stderr.splitlines()[-1].endswith(
            "] /dev/stdin: magic 0x00000c02, expected 0x00000801 (uint8 labels, 1 dimension)"
        )
        assert "Opened" not in done.stderr
        assert not (tmp_path / "db").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [images.name, "train-labels-idx1-ubyte", rows.name]
        )


def test_a_piped_input_logs_caffes_lines_first_and_its_errors_name_it(
    mnist_pair, tmp_path: Path
) -> None:
    images, labels, array, label_array = mnist_pair(5, 4, 4)
    done = _piped(["/dev/stdin", str(labels), "db"], images.read_bytes(), tmp_path)
    assert done.returncode == 0, done.stderr
    logged = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    assert logged == [
        "Opened lmdb db",
        "A total of 5 items.",
        "Rows: 4 Cols: 4",
        "Processed 5 files.",
    ]
    with open_reader(str(tmp_path / "db")) as reader:
        records = list(reader)
    assert [r[0] for r in records] == [b"%08d" % i for i in range(5)]
    cut = _piped(["/dev/stdin", str(labels), "cut"], images.read_bytes()[:-3], tmp_path)
    assert cut.returncode == 1
    assert "/dev/fd/" not in cut.stderr
    assert cut.stderr.splitlines()[-1].split("] ", 1)[1].startswith("/dev/stdin: truncated")
    assert not (tmp_path / "cut").exists()


def test_a_flag_value_that_is_not_utf8_is_shown_as_its_bytes(tmp_path: Path) -> None:
    # Quoted with repr() the value would read '\udcff'; the byte is 0xff.
    flags = tmp_path / "bad.flags"
    flags.write_bytes(b"--backend=\xff\n")
    done = subprocess.run(
        [*ENTRY, f"--flagfile={flags}", "a", "b", "c"], capture_output=True, check=False
    )
    assert done.returncode == 1
    assert (
        done.stderr.decode()
        .splitlines()[-1]
        .endswith("] unknown backend '\\xff': expected one of lmdb, leveldb")
    )


@pytest.mark.parametrize(
    ("target", "flags", "said"),
    [
        (
            "nodir/../db",
            [],
            "nodir/../db: no directory nodir/.. to write it in (nodir does not exist, and '..' "
            "after it would leave it again: create it first, or name the path without '..')",
        ),
        ("images/db", [], "images/db: parent images is not a directory"),
        (
            "foreign",
            ["--overwrite"],
            "foreign: holds 'notes.txt' (a file), which is not part of an LMDB database; "
            "refusing to replace it (--overwrite replaces only an LMDB database)",
        ),
    ],
    ids=["missing-parent", "parent-is-a-file", "foreign-directory"],
)
def test_a_refused_target_logs_no_caffe_line_first(
    tmp_path: Path, target: str, flags: list[str], said: str
) -> None:
    """Caffe's convert_mnist_data checks the headers, opens the database (mkdir), then logs
    "Opened", "A total" and "Rows": a target that cannot be opened is refused before any of
    them, in one line (real Caffe: `F... Check failed: mkdir(...) == 0`, first line)."""
    from helpers import write_idx

    # 1200 black images of 245 x 245 (a sparse file).
    with open(tmp_path / "images", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 1200, 245, 245))
        f.truncate(16 + 1200 * 245 * 245)
    write_idx(tmp_path / "labels", np.zeros(1200, np.uint8))
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    before = sorted(os.listdir(tmp_path))
    done = subprocess.run(
        [*ENTRY, *flags, "images", "labels", target],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("E"), done.stderr
    assert done.stderr.split("] ", 1)[1] == said + "\n"
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(tmp_path / "foreign") == ["notes.txt"]
