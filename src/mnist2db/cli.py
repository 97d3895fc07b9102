"""The ``mnist2db`` command line: click commands only; the work is done by the library.

Only click is imported at start-up: each command imports what it needs when it runs, so
``mnist2db --help`` does not pay for numpy, lmdb or protobuf.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from . import __version__

__all__ = ["cli", "main"]

EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class Interrupted(BaseException):
    """Raised from a signal handler (SIGINT, SIGTERM) so that clean-up code runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def library_errors() -> Iterator[None]:
    """Turn the library's errors into click's one-line ``Error: ...`` with exit code 1."""
    from .errors import Mnist2dbError

    try:
        yield
    except Mnist2dbError as exc:
        raise click.ClickException(str(exc)) from exc


@contextlib.contextmanager
def progress_reporter(label: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a bar on stderr, only on a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    bar: Any = None
    shown = 0

    def report(done: int, total: int) -> None:
        nonlocal bar, shown
        if bar is None:
            bar = click.progressbar(length=total, label=label, file=sys.stderr)
            bar.__enter__()
        bar.update(done - shown)
        shown = done

    try:
        yield report
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mnist2db")
def cli() -> None:
    """Fetch MNIST-format IDX files and convert them to Caffe Datum databases.

    The databases are byte-for-byte what Caffe's convert_mnist_data writes, in LMDB or
    LevelDB.

    Example: mnist2db convert --backend=lmdb train-images-idx3-ubyte train-labels-idx1-ubyte mnist_train_lmdb
    """


@cli.command()
@click.argument("images", type=click.Path(dir_okay=True, path_type=str))
@click.argument("labels", type=click.Path(dir_okay=True, path_type=str))
@click.argument("out_db", type=click.Path(path_type=str))
@click.option(
    "--backend",
    type=click.Choice(["lmdb", "leveldb"], case_sensitive=False),
    default="lmdb",
    show_default=True,
    help="Database to write.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Records per transaction (Caffe: 1000).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT_DB if it is an existing database.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def convert(
    images: str, labels: str, out_db: str, backend: str, batch_size: int, overwrite: bool, quiet: bool
) -> None:
    """Convert an IDX image file and its label file into a Caffe Datum database.

    Each image becomes a Datum (channels=1, height=rows, width=cols, data=pixels, label)
    under the key 00000000, 00000001, ... exactly as Caffe's convert_mnist_data writes it.
    Plain and gzip-compressed IDX files are both read. OUT_DB must not exist (see
    --overwrite); it appears only when complete.

    Example: mnist2db convert --backend=lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/mnist/mnist_train_lmdb
    """
    from .convert import convert as run_convert

    with library_errors(), progress_reporter("Converting", quiet) as progress:
        result = run_convert(
            images,
            labels,
            out_db,
            backend=backend.lower(),
            batch_size=batch_size,
            overwrite=overwrite,
            progress=progress,
        )
    if not quiet:
        click.echo(f"A total of {result.count} items.", err=True)
        click.echo(f"Rows: {result.rows} Cols: {result.cols}", err=True)
        click.echo(f"Processed {result.count} files.", err=True)
        click.echo(
            f"Wrote {result.path} ({result.backend}) in {result.seconds:.2f} s.", err=True
        )


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupted(signum: int, frame: object) -> None:
    # One signal is enough: ignore more while the clean-up runs, so that a second Ctrl-C
    # can neither cut the removal of temporaries short nor print a traceback.
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def run_with_signals(func: Callable[[], Any]) -> None:
    """Run ``func`` so that SIGINT/SIGTERM clean up and exit 130/143 with one line, no traceback.

    The signal handler raises :class:`Interrupted` (a BaseException, so ``except Exception``
    does not swallow it); every ``finally`` and context manager on the way out runs, which is
    how the staging directory of a conversion is removed.
    """
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in _SIGNALS}
    try:
        func()
    except (Interrupted, KeyboardInterrupt) as exc:
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        click.echo("Interrupted", err=True)
        # Handlers stay ignored until the process ends: a late signal would only print a
        # traceback.
        sys.exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)
    except BaseException:
        _restore(previous)
        raise
    _restore(previous)


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(sig, handler)


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    """Entry point of the ``mnist2db`` console script."""
    run_with_signals(lambda: cli.main(args=args, prog_name=prog_name or "mnist2db"))
    # cli.main exits on its own (standalone mode); reaching here means success.
    sys.exit(0)
