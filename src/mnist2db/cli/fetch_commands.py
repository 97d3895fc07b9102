"""The commands that get a dataset: ``fetch`` (download, verify, unpack) and ``create``
(both databases, as Caffe's create_mnist.sh)."""

from __future__ import annotations

import os
from typing import Any

import click

from mnist2db.cli.common import ProgressBars, echo, human_bytes, library_errors
from mnist2db.cli.options import (
    Path,
    backend_option,
    check_record_options,
    data_dir_option,
    dataset_option,
    label_column_option,
    overwrite_option,
    quiet_option,
    record_options,
)
from mnist2db.create import create_databases, orientation_note
from mnist2db.fetch.fetcher import fetch as run_fetch
from mnist2db.selection import seed_note

MIRROR_ENVVAR = "MNIST2DB_MIRROR"
# The transport's defaults, repeated here: importing it at start-up would load urllib and ssl
# (tests/test_fetch.py checks they agree).
DEFAULT_SPEED_LIMIT = 1000
DEFAULT_SPEED_TIME = 30.0


def _fetched_line(item: Any) -> str:
    if item.status == "present":
        return f"{item.path}: present, verified ({item.verified_by}); not downloaded"
    rate = human_bytes(item.nbytes / max(item.seconds, 1e-6))
    verb = {"unpacked": "unpacked from", "extracted": "extracted from"}.get(
        item.status, "fetched from"
    )
    return (
        f"{item.path}: {verb} {item.source} ({human_bytes(item.nbytes)} in "
        f"{item.seconds:.2f} s, {rate}/s), verified ({item.verified_by})"
    )


@click.command()
@dataset_option("Which dataset.")
@data_dir_option("Directory to store the files in.  [default: data/DATASET]")
@click.option(
    "--mirror",
    "mirrors",
    multiple=True,
    metavar="URL",
    help=f"Try this mirror first: an http(s):// or file:// URL or a directory (repeatable; "
    f"{MIRROR_ENVVAR}, whitespace-separated, adds more after these).",
)
@click.option("--force", is_flag=True, help="Download even files present and verified.")
@click.option("--keep-gz", is_flag=True, help="Keep the verified .gz archives too.")
@click.option(
    "--archive-dir",
    type=Path(file_okay=False, path_type=str),
    help="EMNIST: where the verified gzip.zip is kept for every split.  [default: data/emnist]",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a connection or for data.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Retries per mirror after a failure that brought no new bytes (cut, timeout, "
    "HTTP 5xx, a restart from zero).",
)
@click.option(
    "--speed-limit",
    type=click.FloatRange(min=0),
    default=DEFAULT_SPEED_LIMIT,
    show_default=True,
    metavar="BYTES",
    help="Low-speed limit, as curl's: a mirror slower than this many bytes/s for "
    "--speed-time seconds is abandoned for the next one (0: no limit).",
)
@click.option(
    "--speed-time",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SPEED_TIME,
    show_default=True,
    metavar="SECONDS",
    help="How long a mirror may stay under --speed-limit.",
)
@quiet_option
def fetch(
    dataset: str,
    data_dir: str | None,
    mirrors: tuple[str, ...],
    force: bool,
    keep_gz: bool,
    archive_dir: str | None,
    timeout: float,
    retries: int,
    speed_limit: float,
    speed_time: float,
    quiet: bool,
) -> None:
    """Download a dataset's IDX files, verify them, and unpack them.

    Each file is checked against the published digests (of the .gz, or of the unpacked
    file, since mirrors re-compress) before it appears under its final name; files already
    present and verified are not downloaded again. Mirrors are tried in order, transient
    failures retried, partial downloads resumed. HTTPS certificates are always verified;
    proxies come from the environment (https_proxy, no_proxy). EMNIST's splits come from
    one archive, downloaded once and kept (--archive-dir); QMNIST's NIST part is .xz.
    A mirror's bytes, time and requests are bounded (docs/fetching.md): a broken or
    hostile first mirror gives way to the next.

    \b
    Examples:
      mnist2db fetch
      mnist2db fetch --dataset fashion-mnist --mirror /usr/share/datasets/fashion-mnist
      mnist2db fetch --dataset emnist-letters --mirror ~/Downloads
    """
    extra = [*mirrors, *os.environ.get(MIRROR_ENVVAR, "").split()]
    bar = ProgressBars(quiet, in_bytes=True)

    def done(item: Any) -> None:
        bar.close()
        if not quiet:
            echo(_fetched_line(item), err=True)

    with library_errors():
        try:
            results = run_fetch(
                dataset,
                data_dir,
                mirrors=extra,
                force=force,
                keep_gz=keep_gz,
                archive_dir=archive_dir,
                timeout=timeout,
                retries=retries,
                speed_limit=speed_limit,
                speed_time=speed_time,
                progress=bar,
                on_file=done,
            )
        finally:
            bar.close()
    if not quiet:
        where = os.path.dirname(results[0].path) if results else data_dir
        echo(f"{dataset}: {len(results)} files ready in {where}", err=True)


@click.command()
@dataset_option("Which dataset (gives the default --data and --out).")
@data_dir_option("Directory holding the IDX files.  [default: data/DATASET]")
@click.option(
    "--out",
    "out_dir",
    type=Path(file_okay=False, path_type=str),
    help="Directory for the databases.  [default: examples/DATASET]",
)
@backend_option
@overwrite_option("existing databases")
@click.option(
    "--as-stored",
    is_flag=True,
    help="Keep the images as the dataset stores them (EMNIST's are transposed; by default "
    "they are written upright).",
)
@label_column_option
@record_options
@quiet_option
def create(
    dataset: str,
    data_dir: str | None,
    out_dir: str | None,
    backend: str,
    overwrite: bool,
    as_stored: bool,
    quiet: bool,
    **options: Any,
) -> None:
    """Write mnist_train_BACKEND and mnist_test_BACKEND from a fetched dataset.

    What Caffe's create_mnist.sh does: train-images/labels become mnist_train_BACKEND and
    t10k-images/labels become mnist_test_BACKEND, by the same conversion as
    `mnist2db convert`. Each database appears only when complete. EMNIST's images, stored
    transposed, are written upright (--as-stored keeps them as stored); QMNIST's labels are
    column --label-column of its idx2-int rows.

    \b
    Examples:
      mnist2db fetch && mnist2db create --backend=lmdb --overwrite
      mnist2db create --dataset fashion-mnist --backend=leveldb --shuffle --seed 1
    """
    check_record_options(options)
    note = orientation_note(dataset, as_stored)
    if note and not quiet:
        echo(note, err=True)

    bar = ProgressBars(quiet, in_bytes=False)

    def done(result: Any) -> None:
        bar.close()
        if not quiet:
            echo(
                f"Wrote {result.path} ({result.backend}): {result.count} records of "
                f"{result.rows}x{result.cols} in {result.seconds:.2f} s."
                + ("" if result.seed is None else f" {seed_note(result.seed)}"),
                err=True,
            )

    with library_errors():
        try:
            create_databases(
                dataset,
                data_dir,
                out_dir,
                backend,
                overwrite=overwrite,
                progress=bar,
                on_database=done,
                transpose=False if as_stored else None,
                **options,
            )
        finally:
            bar.close()
