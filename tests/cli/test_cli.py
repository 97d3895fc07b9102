"""mnist2db's command line: help, version, summary, and every error path with its exact line."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import idx_bytes, write_idx

from mnist2db import iter_db
from mnist2db.cli.app import cli


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def all_commands() -> list[str]:
    return sorted(cli.list_commands(click.Context(cli)))


@pytest.mark.parametrize("command", all_commands())
def test_every_command_has_help_with_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "\n  Examples:\n    mnist2db " in result.stdout
    assert f"\n    mnist2db {command}" in result.stdout


def test_group_help_and_version() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "convert" in result.stdout
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("mnist2db, version ")


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert "Usage: mnist2db" in done.stdout


def test_convert_prints_caffe_summary(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, labels = mnist_pair(12, 5, 7)
    result = run("convert", ipath, lpath, tmp_path / "db", "--backend", "leveldb")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[:3] == ["A total of 12 items.", "Rows: 5 Cols: 7", "Processed 12 files."]
    assert lines[3].startswith(f"Wrote {tmp_path / 'db'} (leveldb) in ")
    assert [d.label for _, d in iter_db(tmp_path / "db")] == labels.tolist()


def test_convert_quiet(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    result = run("convert", "-q", ipath, lpath, tmp_path / "db")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


def test_backend_is_case_insensitive_and_batch_size_checked(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, *_ = mnist_pair(3)
    assert run("convert", "-q", "--backend=LMDB", ipath, lpath, tmp_path / "db").exit_code == 0
    result = run("convert", "--batch-size", "0", ipath, lpath, tmp_path / "db2")
    assert result.exit_code == 2
    assert "Invalid value for '--batch-size'" in result.stderr


# -- error paths: one line, exit 1 (2 for usage), nothing left behind ---------------------


def _files(tmp_path: Path) -> dict[str, Path]:
    images = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3)
    labels = np.arange(4, dtype=np.uint8)
    return {
        "images": write_idx(tmp_path / "train-images-idx3-ubyte", images),
        "labels": write_idx(tmp_path / "train-labels-idx1-ubyte", labels),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


ERRORS = {
    "wrong image magic": (
        lambda t, f: (_write(t / "bad", idx_bytes(np.zeros((4, 9), np.uint8))), f["labels"]),
        "{0}: magic 0x00000802, expected 0x00000803 (uint8 images, 3 dimensions)",
    ),
    "wrong label magic": (
        lambda t, f: (f["images"], _write(t / "bad", idx_bytes(np.zeros((4,), np.int8)))),
        "{1}: magic 0x00000901, expected 0x00000801 (uint8 labels, 1 dimension)",
    ),
    "swapped arguments": (
        lambda t, f: (f["labels"], f["images"]),
        "{0}: magic 0x00000801, expected 0x00000803 (uint8 images, 3 dimensions)"
        " (is it the label file? the image file comes first)",
    ),
    "count mismatch": (
        lambda t, f: (f["images"], write_idx(t / "l5", np.zeros(5, np.uint8))),
        "{0}: 4 images, but {1} has 5 labels",
    ),
    "truncated header": (
        lambda t, f: (_write(t / "short", b"\0\0\x08\x03\0\0\0\x04\0\0"), f["labels"]),
        "{0}: truncated header: 3 dimension sizes needs 12 bytes, file has 6",
    ),
    "truncated payload": (
        lambda t, f: (_write(t / "cut", f["images"].read_bytes()[:-1]), f["labels"]),
        "{0}: truncated: header declares 36 bytes of data (4 × 3 × 3 uint8), file holds 35",
    ),
    "trailing bytes": (
        lambda t, f: (f["images"], _write(t / "long", f["labels"].read_bytes() + b"\0\0")),
        "{1}: trailing bytes: header declares 4 bytes of data (4 uint8), file holds 6",
    ),
    "absurd dimensions": (
        lambda t, f: (
            _write(t / "huge", bytes([0, 0, 8, 3]) + struct.pack(">3I", 4, 1 << 30, 1 << 30)),
            f["labels"],
        ),
        "{0}: truncated: header declares 4611686018427387904 bytes of data"
        " (4 × 1073741824 × 1073741824 uint8), file holds 0",
    ),
    "non-IDX file": (
        lambda t, f: (_write(t / "notes.txt", b"hello world\n"), f["labels"]),
        "{0}: not an IDX file: magic 0x68656c6c, expected 0x0000 then type and rank",
    ),
    "missing file": (lambda t, f: (t / "nope", f["labels"]), "{0}: no such file"),
    "directory as file": (
        lambda t, f: (f["images"], t),
        "{1}: is a directory, expected an IDX file",
    ),
    "corrupt gzip": (
        lambda t, f: (
            _write(t / "bad.gz", gzip.compress(f["images"].read_bytes())[:-8] + b"\xff" * 8),
            f["labels"],
        ),
        "{0}: corrupt gzip stream: CRC check failed 0xffffffff != 0x",
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_input_errors(tmp_path: Path, case: str, backend: str) -> None:
    make, expected = ERRORS[case]
    images, labels = make(tmp_path, _files(tmp_path))
    out = tmp_path / "out" / "db"
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("convert", "--backend", backend, images, labels, out)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    line = result.stderr.rstrip("\n")
    assert "\n" not in line
    assert line.startswith("Error: " + expected.format(images, labels))
    assert "Traceback" not in result.output
    assert not out.exists()
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "out")
    assert after == before
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_existing_output(tmp_path: Path) -> None:
    files = _files(tmp_path)
    out = tmp_path / "db"
    assert run("convert", "-q", files["images"], files["labels"], out).exit_code == 0
    before = (out / "data.mdb").read_bytes()
    result = run("convert", files["images"], files["labels"], out)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {out}: already exists (use --overwrite to replace it)\n"
    assert (out / "data.mdb").read_bytes() == before
    assert run("convert", "-q", "--overwrite", files["images"], files["labels"], out).exit_code == 0


def test_output_parent_not_a_directory(tmp_path: Path) -> None:
    files = _files(tmp_path)
    out = files["labels"] / "db"
    result = run("convert", files["images"], files["labels"], out)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {out}: parent {files['labels']} is not a directory\n"


def test_unknown_backend(tmp_path: Path) -> None:
    files = _files(tmp_path)
    result = run(
        "convert", "--backend", "rocksdb", files["images"], files["labels"], tmp_path / "db"
    )
    assert result.exit_code == 2
    assert (
        "Invalid value for '--backend': 'rocksdb' is not one of 'lmdb', 'leveldb'." in result.stderr
    )
    assert not (tmp_path / "db").exists()


def test_missing_argument_is_usage_error() -> None:
    result = run("convert", "only-one")
    assert result.exit_code == 2
    assert "Missing argument 'LABELS'" in result.stderr


def test_progress_bar_only_on_a_terminal(mnist_pair, tmp_path: Path) -> None:
    import os
    import pty

    ipath, lpath, *_ = mnist_pair(50, 4, 4)
    primary, secondary = pty.openpty()
    code = "from mnist2db.cli.app import main; main()"
    argv = [sys.executable, "-c", code, "convert", "--batch-size", "10", str(ipath), str(lpath)]
    with subprocess.Popen(
        [*argv, str(tmp_path / "tty_db")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
    ) as proc:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait() == 0
    os.close(primary)
    on_tty = b"".join(chunks).decode()
    assert "Converting" in on_tty and "100%" in on_tty
    assert "Processed 50 files." in on_tty
    piped = subprocess.run(
        [*argv, str(tmp_path / "pipe_db")], capture_output=True, text=True, check=True
    )
    assert "Converting" not in piped.stderr
    assert piped.stderr.splitlines()[0] == "A total of 50 items."


# -- pipes, empty paths ---------------------------------------------------------------------


def _fashionless_pair(tmp_path: Path, count: int = 7) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    return (
        write_idx(tmp_path / "p-images-idx3-ubyte.gz", images, gz=True),
        write_idx(tmp_path / "p-labels-idx1-ubyte", labels),
        images,
    )


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        timeout=120,
    )


@pytest.mark.parametrize("front", ["mnist2db convert -q", "convert_mnist_data"])
def test_convert_reads_process_substitution_and_stdin(tmp_path: Path, front: str) -> None:
    images, labels, array = _fashionless_pair(tmp_path)
    script = (
        f"{front} <(zcat {images}) <(cat {labels}) sub_db && "
        f"zcat {images} | {front} /dev/stdin {labels} stdin_db && "
        f"mkfifo f && (cat {images} > f &) && {front} f {labels} fifo_db"
    )
    done = _bash(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for name in ("sub_db", "stdin_db", "fifo_db"):
        records = list(iter_db(tmp_path / name))
        assert len(records) == 7
        assert records[6][1].data == array[6].tobytes()


def test_info_and_show_read_pipes(tmp_path: Path) -> None:
    images, labels, array = _fashionless_pair(tmp_path)
    done = _bash(
        f"mnist2db info <(zcat {images}) && mnist2db info <(cat {labels}) && "
        f"mnist2db show <(zcat {images}) --labels <(cat {labels}) --count 1 --threshold 128",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "storage     plain, read from a pipe" in lines
    assert "size        5504 bytes expected, 5504 found (header 16 + data)" in lines
    assert "size        15 bytes expected, 15 found (header 8 + data)" in lines
    assert lines.count("valid       yes") == 2
    assert "#0  label " in done.stdout
    assert " ".join("01"[int(v > 128)] for v in array[0][0]) in lines


def test_a_truncated_pipe_is_one_line(tmp_path: Path) -> None:
    images, labels, _ = _fashionless_pair(tmp_path)
    done = _bash(f"mnist2db convert -q <(zcat {images} | head -c 5000) {labels} db", tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: /dev/fd/") and done.stderr.count("\n") == 1
    assert done.stderr.endswith(": truncated: header declares 5488 bytes of data "
                                "(7 × 28 × 28 uint8), file holds 4984\n")  # fmt: skip
    assert not (tmp_path / "db").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["convert", "{i}", "{l}", ""], "OUT_DB"),
        (["convert", "", "{l}", "db"], "IMAGES"),
        (["export", "db", ""], "OUT"),
        (["show", "{i}", "--png", ""], "--png"),
        (["info", ""], "PATH"),
        (["mean", ""], "DB"),
        (["mean", "db", ""], "OUT"),
        (["siamese", "", "{l}", "db"], "IMAGES"),
        (["siamese", "{i}", "{l}", ""], "OUT_DB"),
        (["fetch", "--data", ""], "--data"),
        (["create", "--data", ""], "--data"),
        (["create", "--out", ""], "--out"),
    ],
)
def test_an_empty_path_is_a_usage_error_up_front(
    tmp_path: Path, args: list[str], name: str
) -> None:
    """`convert I L ''` is a usage error up front (it converted everything, then failed with Errno 2)."""
    files = _files(tmp_path)
    argv = [a.format(i=files["images"], l=files["labels"]) for a in args]
    result = run(*argv)
    assert result.exit_code == 2
    assert "an empty path names nothing" in result.stderr
    assert name in result.stderr
    assert not (tmp_path / "db").exists()


def test_every_path_parameter_refuses_an_empty_path() -> None:
    """One path type for every command (cli/options.py): mean and siamese declared their own
    click.Path, so `mnist2db mean ""` exited 1 where the others give the usage error."""
    from mnist2db.cli.options import Path as SharedPath

    ctx = click.Context(cli)
    paths = [
        f"{name} {param.name}"
        for name in cli.list_commands(ctx)
        for param in cli.get_command(ctx, name).params  # type: ignore[union-attr]
        if isinstance(param.type, click.Path) and not isinstance(param.type, SharedPath)
    ]
    assert paths == []


def test_writers_take_any_path_bytes(tmp_path: Path) -> None:
    """Item 6 (the writers): output paths that are not valid UTF-8, every front end."""
    import os

    bindir = Path(sys.executable).parent
    rng = np.random.default_rng(4)
    data = tmp_path / "data"
    data.mkdir()
    for stem, count in (("train", 6), ("t10k", 4)):
        write_idx(
            data / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28), np.uint8)
        )
        write_idx(data / f"{stem}-labels-idx1-ubyte", rng.integers(0, 10, count, np.uint8))
    i, lab = str(data / "train-images-idx3-ubyte"), str(data / "train-labels-idx1-ubyte")
    mnist2db, cmd = str(bindir / "mnist2db"), str(bindir / "convert_mnist_data")
    runs: list[list[str | bytes]] = [
        [mnist2db, "convert", "-q", i, lab, b"fast\xe9_lmdb"],  # the click-free path
        [mnist2db, "convert", "-q", "--batch-size=2", i, lab, b"click\xe9_lmdb"],  # click
        [mnist2db, "convert", "-q", "--backend", "leveldb", i, lab, b"l\xe9_leveldb"],
        [mnist2db, "convert", "-q", "--overwrite", i, lab, b"fast\xe9_lmdb"],
        [mnist2db, "convert", "-q", "--overwrite", "--backend=leveldb", i, lab, b"l\xe9_leveldb"],
        [cmd, "--minloglevel=1", i, lab, b"cmd\xe9_lmdb"],
        [cmd, "--minloglevel=1", "--backend=leveldb", i, lab, b"cmd\xe9_leveldb"],
        [mnist2db, "create", "-q", "--data", str(data), "--out", b"created\xe9"],
        [mnist2db, "convert", "-q", i, lab, "mnist_train_lmdb"],  # read back by the next one
        [mnist2db, "export", "-q", "mnist_train_lmdb", b"exp\xe9"],
        [mnist2db, "show", i, "--count", "2", "--png", b"grid\xe9.png"],
    ]
    for argv in runs:
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr)
        assert b"Traceback" not in done.stderr
    names = set(os.listdir(os.fsencode(tmp_path)))
    assert {b"fast\xe9_lmdb", b"click\xe9_lmdb", b"l\xe9_leveldb", b"cmd\xe9_lmdb"} <= names
    assert {b"cmd\xe9_leveldb", b"created\xe9", b"exp\xe9", b"grid\xe9.png"} <= names
    import lmdb

    for name in (b"fast\xe9_lmdb", b"click\xe9_lmdb", b"cmd\xe9_lmdb"):
        env = lmdb.open(os.fsencode(tmp_path) + b"/" + name, readonly=True, lock=False)
        assert env.stat()["entries"] == 6
        env.close()
    exported = tmp_path / os.fsdecode(b"exp\xe9") / "train-images-idx3-ubyte"
    assert exported.read_bytes() == Path(i).read_bytes()
    assert not [n for n in names if n.startswith(b".")]


# -- --overwrite replaces only what mnist2db wrote, through the command lines -------------


def test_overwrite_keeps_a_project_with_an_empty_current_file(tmp_path: Path) -> None:
    """Item 1 as reported: `touch proj/CURRENT; convert -q I L proj --overwrite` lost thesis.tex."""
    files = _files(tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "CURRENT").touch()
    (proj / "thesis.tex").write_text("important\n")
    for backend in ("lmdb", "leveldb"):
        result = run("convert", "-q", f"--backend={backend}", files["images"], files["labels"],
                     proj, "--overwrite")  # fmt: skip
        assert result.exit_code == 1
        assert result.stderr.count("\n") == 1 and "refusing to replace it" in result.stderr
    assert (proj / "thesis.tex").read_text() == "important\n"
    assert sorted(p.name for p in proj.iterdir()) == ["CURRENT", "thesis.tex"]


@pytest.mark.parametrize("front", ["create", "script"])
def test_create_and_the_script_keep_what_a_database_directory_also_holds(
    tmp_path: Path, front: str
) -> None:
    """The same through `create --overwrite` and scripts/create_mnist.sh."""
    rng = np.random.default_rng(5)
    data = tmp_path / "data" / "mnist"
    data.mkdir(parents=True)
    for stem, count in (("train", 6), ("t10k", 4)):
        write_idx(
            data / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28), np.uint8)
        )
        write_idx(data / f"{stem}-labels-idx1-ubyte", rng.integers(0, 10, count, np.uint8))
    assert (
        run("create", "-q", "--data", data, "--out", tmp_path / "examples" / "mnist").exit_code == 0
    )
    db = tmp_path / "examples" / "mnist" / "mnist_train_lmdb"
    (db / "notes.txt").write_text("mine")
    (db / "runs").mkdir()
    if front == "create":
        result = run("create", "-q", "--overwrite", "--data", data, "--out", db.parent)
        code, err = result.exit_code, result.stderr
    else:
        script = Path(__file__).resolve().parents[2] / "scripts" / "create_mnist.sh"
        done = subprocess.run(
            ["sh", str(script), "-q"],
            cwd=tmp_path,
            env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        code, err = done.returncode, done.stderr
    assert code == 1
    assert err == (
        f"Error: {'examples/mnist/mnist_train_lmdb' if front == 'script' else db}: holds "
        "'notes.txt' (a file), which is not part of an LMDB database; refusing to replace it "
        "(--overwrite replaces only an LMDB database)\n"
    )
    assert (db / "notes.txt").read_text() == "mine" and (db / "runs").is_dir()


def test_convert_refuses_inputs_inside_the_destination(tmp_path: Path) -> None:
    """`convert db/images db/labels db --overwrite` never deletes its own inputs."""
    files = _files(tmp_path)
    db = tmp_path / "db"
    assert run("convert", "-q", files["images"], files["labels"], db).exit_code == 0
    import shutil

    images = Path(shutil.copy(files["images"], db / "t10k-images-idx3-ubyte"))
    labels = Path(shutil.copy(files["labels"], db / "t10k-labels-idx1-ubyte"))
    for front in (["convert", "-q"], ["convert"]):  # the click-free path and click's
        result = run(*front, images, labels, db, "--overwrite")
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: {db}: holds the input {images}; refusing to replace it "
            "(write the database somewhere else)\n"
        )
    done = subprocess.run(
        [sys.executable, "-m", "mnist2db", "convert", "-q", "--overwrite", str(images),
         str(labels), str(db)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (1, result.stderr)
    assert images.read_bytes() == files["images"].read_bytes()
    assert labels.read_bytes() == files["labels"].read_bytes()


def test_paths_that_are_not_utf8_are_shown_as_their_bytes(mnist_pair, tmp_path: Path) -> None:
    # A path byte that is not UTF-8 (0xe9, Latin-1 é) must read \xe9 on both streams, never
    # Python's surrogate \udce9 nor a raw byte a terminal mangles.
    import os

    images, labels, _, _ = mnist_pair(3, 4, 4)
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    db = folder / "db"

    def tool(*args: object) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "mnist2db", *map(str, args)]
        return subprocess.run(command, capture_output=True, check=False)

    shown = str(tmp_path).encode() + b"/caf\\xe9"
    made = tool("convert", images, labels, db)
    assert made.returncode == 0, made.stderr
    described = tool("info", db)
    assert described.stdout.splitlines()[0] == b"database    " + shown + b"/db"
    again = tool("convert", images, labels, db)
    assert again.returncode == 1
    assert (
        again.stderr
        == b"Error: " + shown + b"/db: already exists (use --overwrite to replace it)\n"
    )
    missing = tool("info", folder / "nope")
    assert missing.returncode == 1
    assert missing.stderr == b"Error: " + shown + b"/nope: no such file\n"
