"""Who owns a temporary: the pid in its name, and whether that process still writes (alive,
not exiting, not a zombie, the same start time as its owner recorded)."""

from __future__ import annotations

import os


def owner_pid(rest: str, extensions: tuple[str, ...] = ()) -> int | None:
    """The pid in what follows a temporary's prefix: ``<pid>-<random>[<extension>]``.

    ``<random>`` is what mkstemp/mkdtemp (or :func:`mkdtemp_beside`) add: lowercase letters,
    digits and underscores. Anything else is not a name we made: None.
    """
    pid, dash, random_part = rest.partition("-")
    for extension in extensions:
        if random_part.endswith(extension):
            random_part = random_part[: -len(extension)]
            break
    if not (dash and pid.isascii() and pid.isdigit() and random_part.isascii()):
        return None
    if not random_part.replace("_", "").isalnum() or random_part.lower() != random_part:
        return None
    return int(pid)


def pid_alive(pid: int, started: int | None = None) -> bool:
    """True unless process ``pid`` certainly does not exist (when unsure, assume it does).

    A process that is exiting (``PF_EXITING`` in ``/proc/PID/stat``: a killed writer whose
    large mapping is still being torn down) or has exited and is not yet reaped (a zombie,
    'Z', or dead, 'X': its parent has not waited for it) is gone: it writes nothing more. With ``started``
    (:func:`process_start` recorded by the owner), a process of that pid started at
    another time is another process.
    """
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc (not Linux): the signal's answer
    state, flags, start = stat
    if state in ("Z", "X", "x") or flags & _PF_EXITING:
        return False
    return started is None or start == started


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat``), or None."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[2]


#: A task's flag (include/linux/sched.h): set as it begins to exit, before its memory goes.
_PF_EXITING = 0x4


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, flags, start time)`` of process ``pid`` (``/proc/PID/stat``), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            text = stream.read(4096)
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses: split after it.
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[6]), int(fields[19])
    except (IndexError, ValueError):
        return None
