"""The ``mnist2db`` command line: click commands only; the work is done by the library.

Only click is imported at start-up: each command imports what it needs when it runs, so
``mnist2db --help`` does not pay for numpy, lmdb or protobuf.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from mnist2db import __version__
from mnist2db.cli.caffe_commands import mean, siamese
from mnist2db.cli.common import check_seed, echo, library_errors, progress_reporter
from mnist2db.cli.data_commands import export, info, show, verify
from mnist2db.cli.fetch_commands import create, fetch
from mnist2db.cli.imageset_commands import imageset
from mnist2db.cli.options import (
    Path,
    backend_option,
    label_column_option,
    quiet_option,
    range_options,
    record_options,
    transpose_option,
)
from mnist2db.interrupt import run
from mnist2db.storage.backends import DEFAULT_BATCH_SIZE

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mnist2db")
def cli() -> None:
    """Fetch MNIST-format IDX files and convert them to Caffe Datum databases.

    The databases are byte-for-byte what Caffe's convert_mnist_data writes, in LMDB or
    LevelDB.

    Example: mnist2db convert --backend=lmdb train-images-idx3-ubyte train-labels-idx1-ubyte mnist_train_lmdb
    """


@cli.command()
@click.argument("images", type=Path(dir_okay=True, path_type=str))
@click.argument("labels", type=Path(dir_okay=True, path_type=str))
@click.argument("out_db", type=Path(path_type=str))
@backend_option
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Records per transaction (Caffe: 1000).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT_DB if it is an existing database.")
@transpose_option
@label_column_option
@record_options
@range_options("source item", None)
@quiet_option
def convert(
    images: str,
    labels: str,
    out_db: str,
    backend: str,
    batch_size: int,
    overwrite: bool,
    quiet: bool,
    **options: Any,
) -> None:
    """Convert an IDX image file and its label file into a Caffe Datum database.

    Each image becomes a Datum (channels=1, height=rows, width=cols, data=pixels, label)
    under the key 00000000, 00000001, ... exactly as Caffe's convert_mnist_data writes it.
    Plain, gzip and xz IDX files are read; LABELS may be QMNIST's idx2-int rows
    (--label-column picks the label). --transpose, --shuffle/--seed, --offset/--count and
    --encoded change which items are written, in which order, orientation and form; all in
    OUT_DB/mnist2db.json (never a record). OUT_DB must not exist (see --overwrite); it
    appears only when complete.

    Example: mnist2db convert --backend=lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/mnist/mnist_train_lmdb
    """
    from mnist2db.conversion import convert as run_convert

    check_seed(options)
    with library_errors(), progress_reporter("Converting", quiet) as progress:
        result = run_convert(
            images,
            labels,
            out_db,
            backend=backend.lower(),
            batch_size=batch_size,
            overwrite=overwrite,
            progress=progress,
            **options,
        )
    if not quiet:
        echo(result.summary(), err=True)


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    """Run the click command line; SIGINT/SIGTERM clean up and exit 130/143 with one line."""
    # cli.main exits on its own (standalone mode); returning means success.
    sys.exit(run(lambda: cli.main(args=args, prog_name=prog_name or "mnist2db")))


for _command in (show, info, verify, export, mean, siamese, fetch, create, imageset):
    cli.add_command(_command)
