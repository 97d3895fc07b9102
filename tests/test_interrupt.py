"""interrupt.py: signals as an exception, and the deferred sections that keep a temporary
and its clean-up together. Real signals, sent to this process."""

from __future__ import annotations

import os
import signal

import pytest

from mnist2db.interrupt import Interrupted, deferred, exit_code, signals_raise_interrupted


def test_a_signal_raises_interrupted_with_its_exit_code() -> None:
    with pytest.raises(Interrupted) as caught, signals_raise_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
    assert caught.value.signum == signal.SIGTERM
    assert exit_code(caught.value) == 143
    # After an interruption further signals stay ignored until the process ends.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_signal_inside_a_deferred_block_is_raised_when_it_ends() -> None:
    steps = []
    with pytest.raises(Interrupted) as caught, signals_raise_interrupted():
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            steps.append("created")
            with deferred():  # nested: raised only when the outermost block ends
                steps.append("inner")
            steps.append("handed over")
        steps.append("after")  # never reached
    assert steps == ["created", "inner", "handed over"]
    assert exit_code(caught.value) == 130
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_deferred_block_without_a_signal_changes_nothing() -> None:
    with signals_raise_interrupted(), deferred():
        value = 1
    assert value == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
