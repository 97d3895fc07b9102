"""The commands that look at the data: ``show``, ``info``, ``verify`` (``export``, which
writes it back out, is :mod:`mnist2db.cli.export_commands`)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import click

from mnist2db.cli.common import echo, library_errors, progress_reporter
from mnist2db.cli.options import (
    Path,
    db_argument,
    label_column_option,
    label_db_option,
    optional_sources_arguments,
    overwrite_option,
    quiet_option,
    range_options,
    transpose_option,
)
from mnist2db.errors import RenderError
from mnist2db.formats.datum.message import key_text
from mnist2db.info import describe
from mnist2db.labels.databases import verify_label_db
from mnist2db.render import (
    check_canvas,
    check_text_size,
    drawn_size,
    image_to_gray,
    image_to_text,
    size_check,
    values_to_text,
    write_png_grid,
)
from mnist2db.show import find_labels, select_records
from mnist2db.storage.file_placement import check_file_target
from mnist2db.verify import verify_db


def _check_drawable(source: str, record: Any) -> None:
    """Name the source and the record when an image cannot be drawn (float pixels, or 4 or
    more channels)."""
    try:
        image_to_gray(record.image)
    except RenderError as exc:
        raise click.ClickException(f"{source}: record {record.index}: {exc}") from None


@click.command()
@click.argument("source", type=Path(path_type=str))
@click.option(
    "--labels",
    type=Path(dir_okay=False, path_type=str),
    help="IDX label file for an IDX SOURCE (default: the *-labels-idx1-ubyte file beside it).",
)
@range_options("record", 10)
@transpose_option
@label_column_option
@click.option(
    "--threshold",
    type=click.IntRange(0, 255),
    default=None,
    metavar="T",
    help="Print the seed's 0/1 view: 1 where a pixel is above T.",
)
@click.option("--ascii", "ascii_", is_flag=True, help="Draw with plain ASCII characters.")
@click.option(
    "--png",
    type=Path(dir_okay=False, path_type=str),
    default=None,
    help="Write a labelled grid of the images to this PNG file instead.",
)
@overwrite_option("the --png file if it exists")
def show(
    source: str,
    labels: str | None,
    offset: int,
    count: int,
    threshold: int | None,
    ascii_: bool,
    png: str | None,
    overwrite: bool,
    transpose: bool,
    label_column: int,
) -> None:
    """Show records of an IDX image file or a Datum database: index, key, label, image.

    SOURCE is an IDX image file (plain, gzip or xz; its labels are read from --labels or
    the matching *-labels-idx1-ubyte or *-labels-idx2-int file beside it) or an
    LMDB/LevelDB database directory. Images are drawn in the terminal with Unicode shading
    (--ascii for plain terminals, --threshold for a 0/1 view), or written as a PNG grid
    with --png; --transpose swaps height and width (EMNIST's stored images).

    \b
    Examples:
      mnist2db show examples/mnist/mnist_train_lmdb --offset 40000 --count 10 --png digits.png
      mnist2db show data/mnist/t10k-images-idx3-ubyte --count 3 --ascii
    """
    if png is not None and (threshold is not None or ascii_):
        raise click.UsageError(
            "--png draws images itself: it does not combine with --threshold or --ascii"
        )
    if labels is not None and os.path.isdir(source):
        raise click.UsageError("--labels is for an IDX image file; a database holds its labels")
    if label_column and os.path.isdir(source):
        raise click.UsageError(
            "--label-column picks a column of an idx2-int label file; a database holds its labels"
        )
    if threshold is not None and ascii_:
        raise click.UsageError("--threshold prints 0/1 digits: it does not combine with --ascii")
    with library_errors():
        if png is not None:
            inputs = [source, labels if labels is not None else find_labels(source)]
            check_file_target(png, overwrite, [i for i in inputs if i])  # before any reading
        total, records = select_records(
            source,
            labels,
            offset=offset,
            count=count,
            transpose=transpose,
            label_column=label_column,
            check_size=size_check(source, png),  # before a record is read or decoded
        )
        # A generator holding the files open: closed even when a check below stops early.
        with contextlib.closing(records):  # type: ignore[type-var]
            shown = 0
            if png is not None:
                selected: list[Any] = []
                for record in records:
                    _check_drawable(source, record)
                    if not selected:  # the grid is held in memory: bound it before filling it
                        check_canvas(png, min(count, total - offset), *drawn_size(record.image))
                    selected.append(record)
                captions = [
                    f"#{r.index}: {r.label if r.label is not None else '-'}" for r in selected
                ]
                width, height = write_png_grid(
                    [r.image for r in selected], captions, png, overwrite=overwrite, inputs=inputs
                )
                shown = len(selected)
                noun = "image" if shown == 1 else "images"
                echo(f"Wrote {png}: {shown} {noun}, {width} × {height} pixels.", err=True)
            else:
                for record in records:
                    values = values_to_text(record.image)
                    if values is not None:
                        key = "" if record.key is None else f"  key {key_text(record.key)}"
                        echo(f"#{record.index}{key}  values {values}")
                        shown += 1
                        continue
                    _check_drawable(source, record)
                    check_text_size(f"{source}: record {record.index}", *drawn_size(record.image))
                    head = f"#{record.index}"
                    if record.key is not None:
                        head += f"  key {key_text(record.key)}"
                    head += f"  label {record.label if record.label is not None else '-'}"
                    echo(head)
                    for line in image_to_text(record.image, threshold=threshold, ascii=ascii_):
                        echo(line)
                    echo()
                    shown += 1
    if shown < count:
        echo(f"Showed {shown} of {count} requested: {source} ends at {total} records.", err=True)


@click.command()
@click.argument("path", type=Path(path_type=str))
def info(path: str) -> None:
    """Describe an IDX file or a Datum database; exit 1 if it is not valid.

    For an IDX file: magic, type, dimensions, item count, expected and actual size, gzip,
    xz or plain (and the label histogram of a label file). For a database: backend, record
    count, key range, Datum shape and encoding, label histogram, the options it was
    written with (source, items, orientation, label column, order), size on disk. Reading
    an LMDB database does not wait for, or block, other processes using it.

    \b
    Examples:
      mnist2db info examples/mnist/mnist_train_lmdb
      mnist2db info data/mnist/t10k-labels-idx1-ubyte
    """
    with library_errors():
        described = describe(path)
        for name, value in described.rows():
            echo(f"{name:<12}{value}")
        problem = described.problem
        echo(f"{'valid':<12}{'yes' if problem is None else 'no'}")
    if problem is not None:
        raise click.ClickException(f"{path}: {problem}")


@click.command()
@db_argument
@optional_sources_arguments
@label_db_option(
    "Check that this is DB's label database (DB_labels): the same keys in the same order, "
    "one label record of one width each."
)
@click.option(
    "--isolated",
    is_flag=True,
    help="Read in a child process: a reader ended by a signal (a database changed or cut "
    "short by another process while it is read) is one error line, not this process's end.",
)
@quiet_option
def verify(
    db: str,
    images: str | None,
    labels: str | None,
    label_db: str | None,
    isolated: bool,
    quiet: bool,
) -> None:
    """Check that database DB holds exactly the records converted from IMAGES and LABELS,
    or, without them, the records mnist2db wrote (the digest in DB/mnist2db.json).

    Every record is compared (key, channels, height, width, data, label); the first
    difference exits 1 naming the key and the field, as do missing or extra records. A
    database written with --transpose, --shuffle, --offset/--count or --label-column is
    compared with what those options (recorded in DB/mnist2db.json) make of the source.
    Without IMAGES and LABELS, every record is read and their digest compared with the
    one recorded when mnist2db wrote them: any changed byte is found (a database Caffe
    wrote records none, and exits 1 saying so).
    With --label-db, DB and its label database are checked to be a pair (IMAGES and
    LABELS may then be left out), the first key that breaks it named (see
    docs/labels.md: mnist2db verify photos_lmdb --label-db photos_lmdb_labels).

    \b
    Examples:
      mnist2db verify examples/mnist/mnist_train_lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte
      mnist2db verify examples/mnist/mnist_train_lmdb
    """
    if (images is None) != (labels is None):
        raise click.UsageError("give both IMAGES and LABELS, or neither")
    with library_errors(), progress_reporter("Verifying", quiet) as progress:
        result = None
        if images is not None or label_db is None:
            result = verify_db(db, images, labels, isolated=isolated, progress=progress)
        pair = None
        if label_db is not None:
            pair = verify_label_db(db, label_db, progress=progress)
    if quiet:
        return
    if result is not None and images is None:
        echo(f"OK: {db} holds the {result.count} records written (their digest matches).")
    elif result is not None:
        echo(f"OK: {db} holds the {result.count} records of {images} and {labels}.")
    if pair is not None:
        echo(
            f"OK: {label_db} is the label database of {db}: {pair.count} records under the "
            f"same keys, {pair.width} values each."
        )
