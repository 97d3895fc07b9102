"""``mnist2db convert``: IDX images and labels to a Caffe Datum database (the main job).

A plain ``convert`` command line skips click altogether (:mod:`mnist2db.__main__`); this is
the one definition of the interface, which that fast path mirrors.
"""

from __future__ import annotations

from typing import Any

import click

from mnist2db.cli.common import echo, library_errors, progress_reporter
from mnist2db.cli.options import (
    backend_option,
    batch_size_option,
    check_record_options,
    images_argument,
    label_column_option,
    labels_argument,
    out_db_argument,
    overwrite_option,
    quiet_option,
    range_options,
    record_options,
    transpose_option,
)
from mnist2db.conversion import convert as run_convert


@click.command()
@images_argument
@labels_argument
@out_db_argument
@backend_option
@batch_size_option
@overwrite_option("OUT_DB if it is an existing database")
@transpose_option
@label_column_option
@record_options
@range_options("source item", None)
@click.option("--label-db", is_flag=True,
              help="Also write OUT_DB_labels: each record's every label column (QMNIST's "
                   "idx2-int rows: all 8) as float_data, under the same keys.")  # fmt: skip
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
    --encoded (with --png-compression) change which items are written, in which order,
    orientation and form; all in OUT_DB/mnist2db.json (never a record). OUT_DB must not exist (see --overwrite); it
    appears only when complete.

    \b
    Examples:
      mnist2db convert --backend=lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/mnist/mnist_train_lmdb
      mnist2db convert --shuffle --seed 1 --offset 50000 --count 10000 data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/mnist/mnist_val_lmdb
    """
    check_record_options(options)
    with library_errors(), progress_reporter("Converting", quiet) as progress:
        result = run_convert(
            images,
            labels,
            out_db,
            backend=backend,
            batch_size=batch_size,
            overwrite=overwrite,
            progress=progress,
            **options,
        )
    if not quiet:
        echo(result.summary(), err=True)
