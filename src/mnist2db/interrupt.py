"""SIGINT and SIGTERM as an exception, so that every clean-up on the way out runs.

The front ends (``mnist2db``, its click-free fast path, the Caffe drop-ins) run their work
through :func:`run`: inside :func:`signals_raise_interrupted`, with :class:`Interrupted`
turned into the line ``Interrupted`` and exit code 130 (SIGINT) or 143 (SIGTERM). This module imports neither click nor anything
heavy: the click-free fast path of ``mnist2db convert`` uses it too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Interrupted(BaseException):
    """Raised from the signal handler; a BaseException, so ``except Exception`` lets it pass."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _ignore_signals() -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


# Depth of nested deferred() blocks, and the signal that arrived inside one.
_deferring = [0]
_pending: list[int] = []


def _raise_interrupted(signum: int, frame: object) -> None:
    # One signal is enough: ignore more while the clean-up runs, so that a second Ctrl-C
    # can neither cut the removal of temporaries short nor print a traceback.
    _ignore_signals()
    if _deferring[0]:
        _pending.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving inside the block raises :class:`Interrupted` only when it ends.

    For the few steps that create something and hand it to its clean-up (a temporary file
    and the ``try`` that removes it): an interruption between the two would leave it behind.
    Python runs signal handlers in the main thread, so this holds whatever thread is used.
    """
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        if not _deferring[0] and _pending:
            raise Interrupted(_pending.pop())


@contextlib.contextmanager
def signals_raise_interrupted() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted`.

    After an interruption the signals stay ignored until the process ends (a late signal
    would only print a traceback); otherwise the previous handlers are restored.
    """
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in SIGNALS}
    try:
        yield
    except (Interrupted, KeyboardInterrupt):
        _ignore_signals()
        raise
    except BaseException:
        _restore(previous)
        raise
    _restore(previous)


def _restore(previous: dict[signal.Signals, signal._HANDLER]) -> None:
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(sig, handler)


def exit_code(exc: BaseException) -> int:
    """The exit code for an interruption: 143 for SIGTERM, 130 for SIGINT / KeyboardInterrupt."""
    if isinstance(exc, Interrupted) and exc.signum == signal.SIGTERM:
        return EXIT_SIGTERM
    return EXIT_SIGINT


def run(work: Callable[[], int | None]) -> int:
    """Run a front end's ``work`` with SIGINT and SIGTERM raising :class:`Interrupted`; its
    exit code (None: 0), or, after an interruption, the line ``Interrupted`` on stderr and
    130 or 143. ``SystemExit`` (click's way of finishing) passes through."""
    try:
        with signals_raise_interrupted():
            code = work()
    except (Interrupted, KeyboardInterrupt) as exc:
        sys.stderr.write("Interrupted\n")
        sys.stderr.flush()
        return exit_code(exc)
    return code or 0


def as_script(main: Callable[[], None]) -> NoReturn:
    """Run a console script's ``main`` and end the process as its ``SystemExit`` says, by
    :func:`leave`: the installed scripts' entry points (``main`` itself, as tests and
    ``python -c`` call it, exits the usual way). numpy's OpenBLAS, which nothing of
    mnist2db uses, starts no thread pool (a thread a core, spinning as it starts: ~0.1 s
    of CPU for every command that loads numpy), unless the environment asks for one."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        main()
    except SystemExit as exc:
        leave(exc.code)
    leave(0)


def leave(code: object) -> NoReturn:
    """End the process with ``code`` (as ``sys.exit(code)`` would: None is 0, text is
    written to stderr and gives 1) after doing what the interpreter's exit does that anyone
    can see: the ``atexit`` handlers run (multiprocessing's reaps its children), stdout
    and stderr flushed; but not its teardown of every module and object, ~10 ms after a
    conversion and more with numpy and OpenCV loaded (docs/performance.md). Where a thread
    that is not a daemon still runs (the interpreter would wait for it, and stop idle
    thread pools first), or a flush fails (stdout a closed pipe), the interpreter's own
    exit does it all, as it would have."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    import threading

    current = threading.current_thread()
    if any(t is not current and not t.daemon for t in threading.enumerate()):
        raise SystemExit(code)
    try:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        raise SystemExit(code) from None
    os._exit(code & 0xFF)
