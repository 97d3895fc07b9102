"""Test helpers for the operating system: a real tmpfs mounted for a full-disk test, the
pid of a process that has ended, and work run in a forked child."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real small file system at ``mount`` (created), unmounted afterwards: a real full disk.
    Skips the test where mounting is not allowed (not root, or no mount namespace)."""
    import subprocess

    mount.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def in_forked_child(work: Callable[[], str]) -> str:
    """Run ``work()`` in a child made by os.fork; return what it reported (its text, or its
    exception's type and message). The child never returns into pytest."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read_end)
            try:
                text = work()
            except BaseException as exc:
                text = f"{type(exc).__name__}: {exc}"
            os.write(write_end, text.encode(errors="replace"))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    return text
