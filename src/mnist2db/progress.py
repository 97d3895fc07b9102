"""Progress reporting: the one callback signature, and a no-op when progress is off.

A long operation reports ``progress(done, total)`` after each batch (records, or bytes for a
download; ``total`` 0 when unknown). One that works through several named items (``fetch``'s
files, ``create``'s databases) reports ``progress(name, done, total)``: the same callback
with the item's name in front. Producers call :func:`reporting` once and then report
unconditionally, as pip's ``get_download_progress_renderer`` lets them: the front end decides
whether anything is drawn (the CLI: a bar on stderr, only on a terminal).
"""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(done, total)``.
Progress = Callable[[int, int], None]
#: ``progress(name, done, total)``: a :data:`Progress` per named item.
NamedProgress = Callable[[str, int, int], None]


def _off(done: int, total: int) -> None:
    """Progress is off: nothing to report to."""


def _named_off(name: str, done: int, total: int) -> None:
    """Progress is off: nothing to report to."""


def reporting(progress: Progress | None) -> Progress:
    """``progress``, or a no-op when it is None."""
    return _off if progress is None else progress


def named_reporting(progress: NamedProgress | None) -> NamedProgress:
    """``progress``, or a no-op when it is None."""
    return _named_off if progress is None else progress


def labelled(progress: NamedProgress, name: str) -> Progress:
    """A :data:`Progress` that reports to ``progress`` under ``name``."""

    def report(done: int, total: int) -> None:
        progress(name, done, total)

    return report
