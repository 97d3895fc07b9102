"""interrupt.as_script / leave: the installed scripts end their process without the
interpreter's teardown, yet do all it does that anyone can see (atexit handlers, stdout
and stderr flushed, the exit code as sys.exit gives it; a thread still running waited for,
by the interpreter's own exit). Real processes, each run both ways: ``main`` exiting as
usual and through ``as_script``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import atexit, sys, threading, time
from mnist2db.interrupt import as_script
MARKS = {marks!r}

class Teardown:
    def __del__(self, open=open):  # the interpreter's teardown of this module runs it
        open(MARKS + "/teardown", "w").write("freed")

kept = Teardown()

def main():
    sys.stdout.write("written, not flushed")
    sys.stderr.write("to stderr, not flushed")
    atexit.register(lambda: open(MARKS + "/atexit", "w").write("ran"))
    def late():
        time.sleep(0.2)
        open(MARKS + "/thread", "w").write("done")
    if {thread!r}:
        threading.Thread(target=late).start()
    sys.exit({code!r})

{call}
"""


def _run(
    tmp_path: Path, code: object, fast: bool, thread: bool = False
) -> tuple[int, str, str, set[str]]:
    marks = tmp_path / ("fast" if fast else "usual")
    marks.mkdir()
    call = "as_script(main)" if fast else "main()"
    program = PROGRAM.format(marks=str(marks), code=code, call=call, thread=thread)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr, {p.name for p in marks.iterdir()}


@pytest.mark.parametrize(("code", "status"), [(3, 3), (0, 0), (None, 0), (256 + 7, 7)])
def test_a_script_ends_as_sys_exit_would_without_the_teardown(
    tmp_path: Path, code: object, status: int
) -> None:
    usual = _run(tmp_path, code, fast=False)
    fast = _run(tmp_path, code, fast=True)
    assert usual[:3] == fast[:3] == (status, "written, not flushed", "to stderr, not flushed")
    assert usual[3] == {"atexit", "teardown"}
    assert fast[3] == {"atexit"}  # the same, but no teardown


def test_a_thread_still_running_is_left_to_the_interpreters_exit(tmp_path: Path) -> None:
    usual = _run(tmp_path, 4, fast=False, thread=True)
    fast = _run(tmp_path, 4, fast=True, thread=True)
    assert usual == fast
    assert fast[0] == 4 and fast[3] == {"atexit", "thread", "teardown"}


def test_a_text_exit_is_written_to_stderr_with_status_1(tmp_path: Path) -> None:
    usual = _run(tmp_path, "bad input", fast=False)
    fast = _run(tmp_path, "bad input", fast=True)
    assert usual[:3] == fast[:3] == (1, "written, not flushed", "to stderr, not flushedbad input\n")


def test_a_failed_flush_is_reported_as_the_interpreter_reports_it(tmp_path: Path) -> None:
    """stdout a pipe closed by its reader: both ways end as the interpreter ends then."""
    program = (
        "import sys\nfrom mnist2db.interrupt import as_script\n"
        "def main():\n    sys.stdout.write('x' * 100)\n    sys.exit(0)\n"
    )
    codes = []
    for call in ("main()", "as_script(main)"):
        proc = subprocess.Popen(
            [sys.executable, "-c", program + call], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        proc.stdout.close()  # nothing reads: the flush at the end fails (EPIPE)
        _, err = proc.communicate()
        codes.append((proc.returncode, b"BrokenPipeError" in err))
    assert codes[0] == codes[1] and codes[0][0] != 0 and codes[0][1]
