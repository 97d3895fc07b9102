"""The decoding workers (mnist2db.imageset.workers.pool), with real processes and real signals: results
in list order at every number of workers; a worker that dies or hangs costs its one entry;
memory bounded by bytes while an early entry is slow; SIGTERM ends a run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.imageset.workers.pool import decode_in_order

HERE = Path(__file__).parent


def entries(names: list[str]) -> list[ListEntry]:
    return [ListEntry(i, name.encode(), i % 7) for i, name in enumerate(names)]


class Echo:
    """The entry's path and line, after a delay that varies by line (results come back out
    of order); ``crash``: SIGSEGV; ``hang``: sleeps for ever; ``big``: a result of 4 MB."""

    def __call__(self, entry: ListEntry) -> object:
        name = entry.path.decode()
        if name == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if name == "hang":
            if "ECHO_PIDS" in os.environ:
                with open(os.path.join(os.environ["ECHO_PIDS"], str(os.getpid())), "w"):
                    pass
            time.sleep(3600)
        if name.startswith("slow"):
            time.sleep(float(name[4:]))
        time.sleep((entry.line * 7919 % 5) / 2000)
        if name == "big":
            return (bytes(4 << 20), (1, 1, 1))
        return (entry.path + b":%d" % entry.line, (1, 1, 1))


@pytest.mark.parametrize("jobs", [0, 1, 2, 3])
def test_results_come_in_list_order(jobs: int) -> None:
    listed = entries([f"image{i}" for i in range(300)])
    got = list(decode_in_order(listed, Echo(), b"", jobs))
    assert [entry for entry, _ in got] == listed
    assert [result[0] for _, result in got] == [e.path + b":%d" % e.line for e in listed]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_that_dies_costs_its_image_only(jobs: int) -> None:
    names = [f"image{i}" for i in range(40)]
    names[5] = names[31] = "crash"
    got = list(decode_in_order(entries(names), Echo(), b"root/", jobs))
    assert [entry.line for entry, _ in got] == list(range(40))
    for line in (5, 31):
        assert got[line][1] == "root/crash: cannot read it: its decoder died (SIGSEGV)"
    assert all(isinstance(r, tuple) for i, (_, r) in enumerate(got) if i not in (5, 31))


def test_a_worker_that_hangs_is_killed_and_the_run_goes_on() -> None:
    names = [f"image{i}" for i in range(30)]
    names[3] = "hang"
    started = time.monotonic()
    got = list(decode_in_order(entries(names), Echo(), b"", 2, timeout=1.0))
    assert time.monotonic() - started < 10
    assert got[3][1] == "hang: cannot read it: its decoder took more than 1 s (killed)"
    assert [r[0] for i, (_, r) in enumerate(got) if i != 3] == [
        b"image%d:%d" % (i, i) for i in range(30) if i != 3
    ]


def _child(script: str) -> subprocess.Popen[str]:
    code = f"import sys; sys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(script)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_results_waiting_for_a_slow_image_are_bounded_by_bytes() -> None:
    """The first image takes 2 s, the 120 after it are 4 MB each (480 MB): the parent holds
    its window (32 MiB) and the workers one image each, so its peak stays far below."""
    child = _child(
        """
        from test_decoding_workers import Echo, entries
        from mnist2db.imageset.workers.pool import decode_in_order
        got = 0
        for _, result in decode_in_order(entries(["slow2"] + ["big"] * 120), Echo(), b"", 2):
            got += len(result[0])
        # VmHWM, not ru_maxrss: that counts the spawning process's peak before exec.
        with open("/proc/self/status") as status:
            peak = next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) >> 10
        print(got, peak)
        """
    )
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    got, peak = map(int, out.split())
    assert got == 120 * (4 << 20) + len(b"slow2:0")
    assert peak < 200, f"parent peak {peak} MiB"


def test_sigterm_ends_a_run_at_once_whatever_the_workers_do(tmp_path: Path) -> None:
    os.environ["ECHO_PIDS"] = str(tmp_path)
    try:
        child = _child(
            """
            from test_decoding_workers import Echo, entries
            from mnist2db.imageset.workers.pool import decode_in_order
            from mnist2db.interrupt import run

            def work():
                for _ in decode_in_order(entries(["hang"] * 40), Echo(), b"", 2):
                    pass
            raise SystemExit(run(work))
            """
        )
    finally:
        del os.environ["ECHO_PIDS"]
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2:
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    pids = [int(name) for name in os.listdir(tmp_path)]
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=10)
    assert time.monotonic() - sent < 1.0
    assert child.returncode == 143 and err == "Interrupted\n"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
