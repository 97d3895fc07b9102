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
from conftest import idx_bytes, write_idx

from mnist2db import iter_db
from mnist2db.cli import cli


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def all_commands() -> list[str]:
    return sorted(cli.commands)


@pytest.mark.parametrize("command", all_commands())
def test_every_command_has_help_with_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.stdout
    assert f"mnist2db {command}" in result.stdout


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
    code = "from mnist2db.cli import main; main()"
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
