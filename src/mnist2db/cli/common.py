"""What the click commands share: library errors as click's, the one progress adapter,
and the checks click cannot express. Only click is imported at start-up."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

from mnist2db.errors import Mnist2dbError, printable
from mnist2db.progress import Progress, labelled


def echo(message: str = "", err: bool = False) -> None:
    """``click.echo`` of a line that may name a path: its bytes that are not UTF-8 shown as
    ``\\xNN`` (:func:`mnist2db.errors.printable`), never as ``\\udcNN`` or raw bytes."""
    try:
        click.echo(printable(message), err=err)
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise  # click's main ends a broken pipe quietly (`mnist2db show … | head`)
        # A full or failing stream (`> /dev/full`): one line, and nothing more to it, not
        # even the flush at exit, which would print Python's "Exception ignored" lines.
        stream = sys.stderr if err else sys.stdout
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        name = "standard error" if err else "standard output"
        raise click.ClickException(f"cannot write to {name}: {exc.strerror}") from None


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """Turn the library's errors into click's one-line ``Error: ...`` with exit code 1."""
    try:
        yield
    except Mnist2dbError as exc:
        raise click.ClickException(str(exc)) from exc


class ProgressBars:
    """The CLI's one progress adapter, a :data:`mnist2db.progress.NamedProgress`: one click
    progress bar per name, on stderr, only on a terminal (nothing when ``quiet``);
    ``in_bytes`` shows the amount and the rate; ``unit`` (``"images"``) the rate in those."""

    def __init__(self, quiet: bool, in_bytes: bool, unit: str | None = None) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self.in_bytes = in_bytes
        self.unit = unit
        self.bar: Any = None
        self.name: str | None = None
        self.shown = 0
        self.started = 0.0

    def __call__(self, name: str, done: int, total: int) -> None:
        if not self.enabled:
            return

        if self.bar is None or name != self.name or done < self.shown:
            self.close()
            self.name, self.shown, self.started = name, 0, time.monotonic()
            self.bar = click.progressbar(
                length=max(total, done, 1),
                label=name,
                file=sys.stderr,
                item_show_func=self._describe if self.in_bytes or self.unit else None,
            )
            self.bar.__enter__()
        self.bar.update(done - self.shown, done)
        self.shown = done

    def _describe(self, done: int | None) -> str | None:
        if done is None:
            return None
        rate = done / max(time.monotonic() - self.started, 1e-6)
        if self.unit:
            return f"{rate:.0f} {self.unit}/s"
        return f"{human_bytes(done)}, {human_bytes(rate)}/s"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@contextlib.contextmanager
def progress_reporter(label: str, quiet: bool, unit: str | None = None) -> Iterator[Progress]:
    """A ``progress(done, total)`` callback drawing one bar labelled ``label`` (see
    :class:`ProgressBars`; ``unit``: the rate in those), closed when the block ends."""
    bars = ProgressBars(quiet, in_bytes=False, unit=unit)
    try:
        yield labelled(bars, label)
    finally:
        bars.close()


def check_seed(options: dict[str, Any]) -> None:
    """``--seed`` without ``--shuffle`` is a usage error (exit 2)."""
    if options["seed"] is not None and not options["shuffle"]:
        raise click.UsageError("--seed orders a shuffle: add --shuffle")


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"
