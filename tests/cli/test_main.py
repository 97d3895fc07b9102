"""``mnist2db`` / ``python -m mnist2db``: the click-free path of a plain ``convert`` behaves
as the click command does (output, messages, exit codes, records)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from db_helpers import record_digest
from helpers import write_idx

from mnist2db.__main__ import parse_convert

# -- the click-free launcher --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["convert", "a", "b", "c"], {"images": "a", "labels": "b", "out": "c"}),
        (
            [
                "convert",
                "-q",
                "--backend=LevelDB",
                "a",
                "--batch-size",
                "7",
                "b",
                "c",
                "--overwrite",
            ],
            {
                "quiet": True,
                "backend": "leveldb",
                "batch_size": 7,
                "overwrite": True,
                "images": "a",
                "labels": "b",
                "out": "c",
            },
        ),
    ],
)
def test_parse_convert_accepts_plain_command_lines(
    args: list[str], expected: dict[str, object]
) -> None:
    assert parse_convert(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["convert", "--help"],
        ["convert", "a", "b"],
        ["convert", "a", "b", "c", "d"],
        ["convert", "--backend=sqlite", "a", "b", "c"],
        ["convert", "--batch-size=0", "a", "b", "c"],
        ["convert", "--batch-size=1_000", "a", "b", "c"],
        ["convert", "--batch-size", "a", "b", "c"],
        ["convert", "-q", "-q", "a", "b", "c"],
        ["convert", "--quiet=yes", "a", "b", "c"],
        ["convert", "--", "a", "b", "c"],
        ["convert", "-", "b", "c"],
        ["convert", "", "b", "c"],
        ["fetch", "a", "b", "c"],
    ],
)
def test_parse_convert_leaves_everything_else_to_click(args: list[str]) -> None:
    assert parse_convert(args) is None


LAUNCH = (
    "import sys\n"
    "from mnist2db.__main__ import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('click' in sys.modules)\n"
)


def run_both(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], ...]:
    """Run ``args`` through the launcher (fast path) and through click (mnist2db.cli.app.main)."""
    fast = subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, cwd=cwd
    )
    slow = subprocess.run(
        [sys.executable, "-c", "from mnist2db.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    return fast, slow


def test_launcher_converts_without_click_like_click(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(30)
    fast = subprocess.run(
        [sys.executable, "-c", LAUNCH, "convert", str(ipath), str(lpath), "fast_db"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    slow = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mnist2db.cli.app import main; main()",
            "convert",
            str(ipath),
            str(lpath),
            "slow_db",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (fast.returncode, fast.stdout) == (0, "False\n")  # click was never imported
    assert slow.returncode == 0
    strip_time = [line.rsplit(" in ", 1)[0] for line in fast.stderr.splitlines()]
    assert strip_time == [
        line.rsplit(" in ", 1)[0].replace("slow_db", "fast_db") for line in slow.stderr.splitlines()
    ]
    assert strip_time[0] == "A total of 30 items."
    assert record_digest(tmp_path / "fast_db") == record_digest(tmp_path / "slow_db")


@pytest.mark.parametrize(
    ("args", "code", "first_line"),
    [
        (["convert", "-q", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (["convert", "no-images", "no-labels", "db"], 1, "Error: no-images: no such file"),
        (
            ["convert", "--batch-size", "0", "a", "b", "db"],
            2,
            "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB",
        ),
        (["convert", "a", "b"], 2, "Usage: mnist2db convert [OPTIONS] IMAGES LABELS OUT_DB"),
    ],
)
def test_launcher_errors_match_click(
    tmp_path: Path, args: list[str], code: int, first_line: str
) -> None:
    fast, slow = run_both(args, tmp_path)
    assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    assert fast.returncode == code
    assert fast.stderr.splitlines()[0] == first_line


def test_launcher_refuses_an_existing_output_like_click(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, _, _ = mnist_pair(3)
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "notes.txt").write_text("mine")
    fast, slow = run_both(["convert", "-q", str(ipath), str(lpath), "db"], tmp_path)
    assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    assert fast.returncode == 1
    assert fast.stderr == "Error: db: already exists (use --overwrite to replace it)\n"
    assert (tmp_path / "db" / "notes.txt").read_text() == "mine"


# -- memory -------------------------------------------------------------------------------


#: Spawns argv[1:] and prints its peak RSS. Linux counts the spawning process's memory in
#: the child's ru_maxrss (exec records the old address space's high-water mark), so the
#: child is spawned from this bare interpreter rather than from pytest.
REAPER = (
    "import os, sys\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def peak_rss_kib(argv: list[str]) -> int:
    result = subprocess.run(
        [sys.executable, "-c", REAPER, *argv], capture_output=True, text=True, check=True
    )
    code, peak = result.stdout.split()[-2:]
    assert code == "0", result
    return int(peak)


def test_memory_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    """Ten times the records (31 MB more pixels) adds only a few MB of peak RSS.

    A converter holding the dataset (or all its values) would add at least the 31 MB.
    """
    peaks = {}
    for count in (4000, 40000):
        rng = np.random.default_rng(count)
        images = write_idx(
            tmp_path / f"img{count}", rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        )
        labels = write_idx(tmp_path / f"lab{count}", rng.integers(0, 10, count, dtype=np.uint8))
        peaks[count] = peak_rss_kib(
            [
                sys.executable,
                "-c",
                LAUNCH,
                "convert",
                "-q",
                str(images),
                str(labels),
                str(tmp_path / f"db{count}"),
            ]
        )
    assert peaks[40000] - peaks[4000] < 12 * 1024, peaks


def test_launcher_prints_a_non_utf8_path_as_its_bytes(mnist_pair, tmp_path: Path) -> None:
    """The fast path's summary names a database whose name is not UTF-8 as click's does:
    the byte spelled out (\\xe9), never a surrogate (\\udce9)."""
    ipath, lpath, _, _ = mnist_pair(3)
    lines = []
    for name, launcher in (
        (b"fast", LAUNCH),
        (b"click", "from mnist2db.cli.app import main; main()"),
    ):
        out = os.fsdecode(b"caf\xe9_" + name)
        done = subprocess.run(
            [sys.executable, "-c", launcher, "convert", str(ipath), str(lpath), out],
            capture_output=True,
            cwd=tmp_path,
            check=True,
        )
        lines.append(done.stderr.decode().splitlines()[-1].rsplit(" in ", 1)[0])
        assert os.path.isdir(os.path.join(os.fsencode(tmp_path), b"caf\xe9_" + name))
    assert lines == [r"Wrote caf\xe9_fast (lmdb)", r"Wrote caf\xe9_click (lmdb)"]


def _samples(param: object) -> list[list[str]]:
    """Command-line spellings of one of convert's click options, valid for click."""
    import click

    assert isinstance(param, click.Option)
    names = [n for n in param.opts + param.secondary_opts]
    if param.is_flag:
        return [[n] for n in names]
    if isinstance(param.type, click.Choice):
        values = [str(c) for c in param.type.choices] + [str(param.type.choices[0]).upper()]
    elif isinstance(param.type, click.IntRange | click.types.IntParamType):
        values = ["7", "1"]
    else:
        values = ["x"]
    return [[n, v] for n in names for v in values] + [[f"{n}={v}"] for n in names for v in values]


def test_the_fast_path_parses_every_option_as_click_does_or_leaves_it_to_click() -> None:
    """Over every option click declares for ``convert`` (cli/options.py): a command line
    the fast path takes gives the keyword arguments click gives; any other is left to click."""
    from mnist2db.cli.app import cli

    command = cli.get_command(None, "convert")  # type: ignore[arg-type]
    assert command is not None
    taken = set()
    for param in command.params:
        if param.param_type_name != "option":
            continue
        for spelled in _samples(param):
            args = ["convert", *spelled, "a", "b", "c"]
            fast = parse_convert(args)
            if fast is None:
                continue
            taken.add(param.name)
            ctx = command.make_context("convert", args[1:])
            from_click = {**ctx.params, "out": ctx.params["out_db"]}
            assert {k: from_click[k] for k in fast} == fast, args
    # what the fast path knows is declared for click too, under the same names
    assert taken == {"backend", "batch_size", "overwrite", "quiet"}
