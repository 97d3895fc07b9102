"""The command-line options and argument types the commands share: each declared once here.

Each option mirrors a keyword argument of the library (``--label-column`` ↔
``label_column``). Only click and the dataset table (no network imports) are imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mnist2db.cli.common import check_seed
from mnist2db.fetch.catalog import DATASET_NAMES, DEFAULT_DATASET
from mnist2db.formats.png.encoder import ENCODINGS, PNG_COMPRESSIONS
from mnist2db.storage.databases.backends import (
    BACKENDS,
    BATCH_BYTES_LIMIT,
    DEFAULT_BACKEND,
    DEFAULT_BATCH_SIZE,
)

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Path(click.Path):
    """click.Path that refuses an empty string up front (a usage error, exit 2)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value == "":
            self.fail("an empty path names nothing", param, ctx)
        return super().convert(value, param, ctx)


def _lower(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return value.lower()


def backend_choice(default: str, help_text: str) -> Decorator:
    """``--backend lmdb|leveldb`` (any case), with the command's default; the command gets
    the name in lower case (the one place the CLI lower-cases it)."""
    return click.option(
        "--backend",
        type=click.Choice(BACKENDS, case_sensitive=False),
        default=default,
        show_default=True,
        callback=_lower,
        help=help_text,
    )


backend_option = backend_choice(DEFAULT_BACKEND, "Database to write.")
batch_size_option = click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Records per transaction (Caffe: 1000); fewer where they would hold more than "
    f"{BATCH_BYTES_LIMIT >> 20} MiB.",
)
quiet_option = click.option(
    "-q", "--quiet", is_flag=True, help="Print nothing but errors (no progress bar, no summary)."
)


def overwrite_option(what: str) -> Decorator:
    """``--overwrite``: replace ``what`` (a phrase naming the command's output)."""
    return click.option("--overwrite", is_flag=True, help=f"Replace {what}.")


def images_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """``IMAGES``: an IDX image file (plain, gzip or xz; a pipe too)."""
    return click.argument("images", type=Path(path_type=str))(func)


def labels_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """``LABELS``: an IDX label file."""
    return click.argument("labels", type=Path(path_type=str))(func)


def optional_sources_arguments(func: Callable[..., Any]) -> Callable[..., Any]:
    """``[IMAGES LABELS]``: ``verify``'s sources, both or neither (without them, it checks
    the records' digest)."""
    func = click.argument("labels", type=Path(path_type=str), required=False)(func)
    return click.argument("images", type=Path(path_type=str), required=False)(func)


def db_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """``DB``: a database directory to read."""
    return click.argument("db", type=Path(path_type=str))(func)


def out_db_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """``OUT_DB``: the database directory to write."""
    return click.argument("out_db", type=Path(path_type=str))(func)


def seed_option(help_text: str) -> Decorator:
    """``--seed N``: any 64-bit unsigned seed; unset, a fresh one is drawn (and reported)."""
    return click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None, help=help_text)


def label_db_option(help_text: str) -> Decorator:
    """``--label-db LABEL_DB``: the label database beside DB (``DB_labels``, float targets under
    DB's keys: :mod:`mnist2db.labels.databases`)."""
    return click.option(
        "--label-db", type=Path(file_okay=False, path_type=str), default=None, help=help_text
    )


def dataset_option(help_text: str) -> Decorator:
    return click.option(
        "--dataset",
        type=click.Choice(DATASET_NAMES),
        default=DEFAULT_DATASET,
        show_default=True,
        help=help_text,
    )


def data_dir_option(help_text: str) -> Decorator:
    return click.option(
        "--data", "data_dir", type=Path(file_okay=False, path_type=str), help=help_text
    )


def range_options(noun: str, count_default: int | None) -> Decorator:
    """``--offset N --count M``: the ``noun`` items (records, source items) ``N … N+M-1``,
    from 0; ``count_default`` None means to the end of the source. The range is checked by
    :func:`mnist2db.selection.check_range`."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option(
            "--count",
            type=click.IntRange(min=1 if count_default is not None else 0),
            default=count_default,
            show_default=count_default is not None,
            help=f"Number of {noun}s."
            + ("" if count_default is not None else "  [default: to the end]"),
        )(func)
        return click.option(
            "--offset",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help=f"First {noun} (from 0).",
        )(func)

    return decorate


transpose_option = click.option(
    "--transpose",
    is_flag=True,
    help="Swap each image's height and width (EMNIST stores its images transposed).",
)
label_column_option = click.option(
    "--label-column",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="For a QMNIST idx2-int label file: the column that is the label (0: the class).",
)


def shuffle_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--shuffle`` and ``--seed N``: records in a seeded random order."""
    func = seed_option(
        "Seed of --shuffle: the same seed gives the same database.  [default: fresh]"
    )(func)
    return click.option(
        "--shuffle",
        is_flag=True,
        help="Write the records in a random order (keys still 00000000, ...).",
    )(func)


encoded_option = click.option(
    "--encoded",
    type=click.Choice(ENCODINGS),
    default=None,
    help="Store each image as a PNG in Datum.data (encoded: true; Caffe's data layer decodes "
    "it).  [default: raw pixels]",
)


png_compression_option = click.option(
    "--png-compression",
    type=click.Choice(PNG_COMPRESSIONS),
    default=None,
    help="With --encoded png: fast (fixed-code deflate: quick to write and to read, the "
    "same bytes on every machine) or small (zlib: ~12% smaller, slower both ways).  "
    "[default: fast]",
)


def record_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``convert``'s and ``create``'s options on how records are written: ``--shuffle``,
    ``--seed``, ``--encoded`` and ``--png-compression`` (check them with
    :func:`check_record_options`)."""
    return shuffle_options(encoded_option(png_compression_option(func)))


def check_record_options(options: dict[str, Any]) -> None:
    """The usage errors (exit 2) among :func:`record_options`: ``--seed`` without
    ``--shuffle``, ``--png-compression`` without ``--encoded png``. An unset
    ``--png-compression`` is dropped, leaving the library's default."""
    check_seed(options)
    if options["png_compression"] is None:
        del options["png_compression"]
    elif options["encoded"] != "png":
        raise click.UsageError("--png-compression compresses PNG records: add --encoded png")
