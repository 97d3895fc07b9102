"""The ``mnist2db`` command line: click commands only; the work is done by the library.

Only click is imported at start-up: each command imports what it needs when it runs, so
``mnist2db --help`` does not pay for numpy, lmdb or protobuf.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from . import __version__
from .backends import BACKENDS, DEFAULT_BATCH_SIZE
from .interrupt import Interrupted, exit_code, signals_raise_interrupted
from .options import (
    Path,
    backend_option,
    data_dir_option,
    dataset_option,
    label_column_option,
    quiet_option,
    range_options,
    record_options,
    transpose_option,
)

__all__ = ["cli", "main"]


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
    from .conversion import convert as run_convert

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
        click.echo(result.summary(), err=True)


def check_seed(options: dict[str, Any]) -> None:
    """``--seed`` without ``--shuffle`` is a usage error (exit 2)."""
    if options["seed"] is not None and not options["shuffle"]:
        raise click.UsageError("--seed orders a shuffle: add --shuffle")


def main(args: list[str] | None = None, prog_name: str | None = None) -> None:
    """Run the click command line; SIGINT/SIGTERM clean up and exit 130/143 with one line."""
    try:
        with signals_raise_interrupted():
            cli.main(args=args, prog_name=prog_name or "mnist2db")
    except (Interrupted, KeyboardInterrupt) as exc:
        click.echo("Interrupted", err=True)
        sys.exit(exit_code(exc))
    # cli.main exits on its own (standalone mode); reaching here means success.
    sys.exit(0)


# -- Looking at the data: show, info, verify, export ---------------------------------------


def _check_drawable(source: str, record: Any) -> None:
    """Name the source and the record when an image cannot be drawn (float or 2-channel data)."""
    from .errors import RenderError
    from .render import image_to_gray

    try:
        image_to_gray(record.image)
    except RenderError as exc:
        raise click.ClickException(f"{source}: record {record.index}: {exc}") from None


@cli.command()
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
@click.option("--overwrite", is_flag=True, help="Replace the --png file if it exists.")
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

    Example: mnist2db show examples/mnist/mnist_train_lmdb --offset 40000 --count 10 --png digits.png
    """
    import os

    from .datum import key_text
    from .pairs import check_file_target
    from .render import check_canvas, image_to_text, write_png_grid
    from .selection import select_records

    if png is not None and (threshold is not None or ascii_):
        raise click.UsageError(
            "--png draws images itself: it does not combine with --threshold or --ascii"
        )
    if labels is not None and os.path.isdir(source):
        raise click.UsageError("--labels is for an IDX image file; a database holds its labels")
    if threshold is not None and ascii_:
        raise click.UsageError("--threshold prints 0/1 digits: it does not combine with --ascii")
    with library_errors():
        if png is not None:
            inputs = [source] if labels is None else [source, labels]
            check_file_target(png, overwrite, inputs)  # before reading anything
        total, records = select_records(
            source,
            labels,
            offset=offset,
            count=count,
            transpose=transpose,
            label_column=label_column,
        )
        # A generator holding the files open: closed even when a check below stops early.
        with contextlib.closing(records):  # type: ignore[type-var]
            shown = 0
            if png is not None:
                selected: list[Any] = []
                for record in records:
                    _check_drawable(source, record)
                    if not selected:  # the grid is held in memory: bound it before filling it
                        check_canvas(png, min(count, total - offset), *record.image.shape[1:])
                    selected.append(record)
                captions = [
                    f"#{r.index}: {r.label if r.label is not None else '-'}" for r in selected
                ]
                width, height = write_png_grid(
                    [r.image for r in selected], captions, png, overwrite=overwrite
                )
                shown = len(selected)
                click.echo(f"Wrote {png}: {shown} images, {width} × {height} pixels.", err=True)
            else:
                for record in records:
                    _check_drawable(source, record)
                    head = f"#{record.index}"
                    if record.key is not None:
                        head += f"  key {key_text(record.key)}"
                    head += f"  label {record.label if record.label is not None else '-'}"
                    click.echo(head)
                    for line in image_to_text(record.image, threshold=threshold, ascii=ascii_):
                        click.echo(line)
                    click.echo()
                    shown += 1
    if shown < count:
        click.echo(
            f"Showed {shown} of {count} requested: {source} ends at {total} records.", err=True
        )


@cli.command()
@click.argument("path", type=Path(path_type=str))
def info(path: str) -> None:
    """Describe an IDX file or a Datum database; exit 1 if it is not valid.

    For an IDX file: magic, type, dimensions, item count, expected and actual size, gzip,
    xz or plain (and the label histogram of a label file). For a database: backend, record
    count, key range, Datum shape and encoding, label histogram, the options it was
    written with (source, items, orientation, label column, order), size on disk. Reading
    an LMDB database does not wait for, or block, other processes using it.

    Example: mnist2db info examples/mnist/mnist_train_lmdb
    """
    import os

    from .info import db_info, idx_info

    with library_errors():
        described = db_info(path) if os.path.isdir(path) else idx_info(path)
        for name, value in described.rows():
            click.echo(f"{name:<12}{value}")
        problem = described.problem
        click.echo(f"{'valid':<12}{'yes' if problem is None else 'no'}")
    if problem is not None:
        raise click.ClickException(f"{path}: {problem}")


@cli.command()
@click.argument("db", type=Path(path_type=str))
@click.argument("images", type=Path(path_type=str))
@click.argument("labels", type=Path(path_type=str))
@quiet_option
def verify(db: str, images: str, labels: str, quiet: bool) -> None:
    """Check that database DB holds exactly the records converted from IMAGES and LABELS.

    Every record is compared (key, channels, height, width, data, label); the first
    difference exits 1 naming the key and the field, as do missing or extra records. A
    database written with --transpose, --shuffle, --offset/--count or --label-column is
    compared with what those options (recorded in DB/mnist2db.json) make of the source.

    Example: mnist2db verify examples/mnist/mnist_train_lmdb data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte
    """
    from .verify import verify_db

    with library_errors(), progress_reporter("Verifying", quiet) as progress:
        result = verify_db(db, images, labels, progress=progress)
    if not quiet:
        click.echo(f"OK: {db} holds the {result.count} records of {images} and {labels}.")


@cli.command()
@click.argument("db", type=Path(path_type=str))
@click.argument("out_dir", type=Path(file_okay=False, path_type=str))
@click.option(
    "--prefix",
    default=None,
    help="File name stem: PREFIX-images-idx3-ubyte, PREFIX-labels-idx1-ubyte "
    "(default: t10k for a test database, train for a training one).",
)
@click.option("--overwrite", is_flag=True, help="Replace existing files of the same names.")
@quiet_option
def export(db: str, out_dir: str, prefix: str | None, overwrite: bool, quiet: bool) -> None:
    """Write the IDX image and label files back from database DB into OUT_DIR.

    For a database made by convert, the files equal the originals byte for byte; one made
    with options (DB/mnist2db.json) is mapped back to its source items: a shuffle and a
    transposition are undone, and the labels are the Datum labels as uint8 (idx1). The
    files appear only when both are complete.

    Example: mnist2db export examples/mnist/mnist_train_lmdb out/
    """
    from .export import export_db

    with library_errors(), progress_reporter("Exporting", quiet) as progress:
        result = export_db(db, out_dir, prefix=prefix, overwrite=overwrite, progress=progress)
    if not quiet:
        click.echo(
            f"Wrote {result.images} and {result.labels} ({result.count} items, "
            f"{result.rows} × {result.cols}).",
            err=True,
        )
        for note in result.notes:
            click.echo(f"  {note}", err=True)


# -- Caffe's other data tools: the mean file and siamese pairs -----------------------------


@cli.command()
@click.argument("db", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(dir_okay=False, path_type=str), required=False)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No 'Wrote' line.")
def mean(db: str, out: str | None, overwrite: bool, quiet: bool) -> None:
    """Compute the mean image of database DB, as Caffe's compute_image_mean, and print
    per-channel mean and standard deviation (the numbers torchvision's Normalize wants).

    OUT.binaryproto (any name but *.npy) gets exactly the bytes compute_image_mean writes;
    OUT.npy the float32 (channels, height, width) mean.

    Example: mnist2db mean examples/mnist/mnist_train_lmdb examples/mnist/mean.binaryproto
    """
    from .meanfile import compute_mean, write_mean

    with library_errors():
        result = compute_mean(db)
        written = None if out is None else write_mean(result, out, overwrite=overwrite)
    channels = " × ".join(map(str, result.mean.shape))
    click.echo(f"{db}: {result.count} records of {channels} (channels × height × width)")
    for c, (m, s) in enumerate(zip(result.channel_means, result.channel_stds, strict=True)):
        click.echo(
            f"channel {c}: mean {m:.4f} std {s:.4f} (0-255); {m / 255:.4f} {s / 255:.4f} (0-1)"
        )
    means = ", ".join(f"{m / 255:.4f}" for m in result.channel_means)
    stds = ", ".join(f"{s / 255:.4f}" for s in result.channel_stds)
    comma = "," if len(result.channel_means) == 1 else ""
    click.echo(f"Normalize(mean=({means}{comma}), std=({stds}{comma}))")
    if out is not None and not quiet:
        click.echo(f"Wrote {out} ({written} bytes).", err=True)


@cli.command()
@click.argument("images", type=click.Path(path_type=str))
@click.argument("labels", type=click.Path(path_type=str))
@click.argument("out_db", type=click.Path(path_type=str))
@click.option(
    "--backend",
    type=click.Choice(BACKENDS, case_sensitive=False),
    default="leveldb",
    show_default=True,
    help="Database to write (Caffe's siamese example reads LevelDB).",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**64 - 1),
    default=None,
    help="Seed of the random pairs: the same seed gives the same database.  [default: fresh]",
)
@click.option(
    "--pairs",
    type=click.IntRange(min=0),
    default=None,
    help="Number of pairs.  [default: one per image]",
)
@click.option("--balanced", is_flag=True, help="Make exactly half the pairs same-class.")
@click.option("--overwrite", is_flag=True, help="Replace OUT_DB if it is an existing database.")
@quiet_option
def siamese(
    images: str,
    labels: str,
    out_db: str,
    backend: str,
    seed: int | None,
    pairs: int | None,
    balanced: bool,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Write a database of random image pairs for Caffe's siamese example.

    Each record is a Datum of 2 channels (the two images) labelled 1 if they are of the
    same class, else 0: what Caffe's convert_mnist_siamese_data writes. OUT_DB appears
    only when complete.

    Example: mnist2db siamese --seed 1 data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/siamese/mnist_siamese_train_leveldb
    """
    from .siamese import convert_siamese

    with library_errors(), progress_reporter("Pairing", quiet) as progress:
        result = convert_siamese(
            images,
            labels,
            out_db,
            backend=backend.lower(),
            seed=seed,
            pairs=pairs,
            balanced=balanced,
            overwrite=overwrite,
            progress=progress,
        )
    if not quiet:
        click.echo(result.summary(), err=True)


# -- fetch and create: the dataset downloaded, verified, and turned into both databases ----

MIRROR_ENVVAR = "MNIST2DB_MIRROR"


class _BarPerName:
    """A ``progress(name, done, total)`` callback: one progress bar per name, on stderr,
    only on a terminal; ``in_bytes`` shows the amount and the rate."""

    def __init__(self, quiet: bool, in_bytes: bool) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self.in_bytes = in_bytes
        self.bar: Any = None
        self.name: str | None = None
        self.shown = 0
        self.started = 0.0

    def __call__(self, name: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        import time

        if self.bar is None or name != self.name or done < self.shown:
            self.close()
            self.name, self.shown, self.started = name, 0, time.monotonic()
            self.bar = click.progressbar(
                length=max(total, done, 1),
                label=name,
                file=sys.stderr,
                item_show_func=self._describe if self.in_bytes else None,
            )
            self.bar.__enter__()
        self.bar.update(done - self.shown, done)
        self.shown = done

    def _describe(self, done: int | None) -> str | None:
        import time

        if done is None:
            return None
        rate = done / max(time.monotonic() - self.started, 1e-6)
        return f"{_human_bytes(done)}, {_human_bytes(rate)}/s"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _fetched_line(item: Any) -> str:
    if item.status == "present":
        return f"{item.path}: present, verified ({item.verified_by}); not downloaded"
    rate = _human_bytes(item.nbytes / max(item.seconds, 1e-6))
    verb = {"unpacked": "unpacked from", "extracted": "extracted from"}.get(
        item.status, "fetched from"
    )
    return (
        f"{item.path}: {verb} {item.source} ({_human_bytes(item.nbytes)} in "
        f"{item.seconds:.2f} s, {rate}/s), verified ({item.verified_by})"
    )


def _human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


@cli.command()
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
    type=click.Path(file_okay=False, path_type=str),
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
    help="Retries per mirror after a transient failure (cut, timeout, HTTP 5xx).",
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
    quiet: bool,
) -> None:
    """Download a dataset's IDX files, verify them, and unpack them.

    Each file is checked against the published digests (of the .gz, or of the unpacked
    file, since mirrors re-compress) before it appears under its final name; files already
    present and verified are not downloaded again. Mirrors are tried in order, transient
    failures retried, partial downloads resumed. HTTPS certificates are always verified;
    proxies come from the environment (https_proxy, no_proxy). EMNIST's splits come from
    one archive, downloaded once and kept (--archive-dir); QMNIST's NIST part is .xz.

    Example: mnist2db fetch --dataset fashion-mnist --mirror http://cache.internal/fashion-mnist/
    """
    import os

    from .fetch import fetch as run_fetch

    extra = [*mirrors, *os.environ.get(MIRROR_ENVVAR, "").split()]
    bar = _BarPerName(quiet, in_bytes=True)

    def done(item: Any) -> None:
        bar.close()
        if not quiet:
            click.echo(_fetched_line(item), err=True)

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
                progress=bar,
                on_file=done,
            )
        finally:
            bar.close()
    if not quiet:
        where = os.path.dirname(results[0].path) if results else data_dir
        click.echo(f"{dataset}: {len(results)} files ready in {where}", err=True)


@cli.command()
@dataset_option("Which dataset (gives the default --data and --out).")
@data_dir_option("Directory holding the IDX files.  [default: data/DATASET]")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=str),
    help="Directory for the databases.  [default: examples/DATASET]",
)
@backend_option
@click.option("--overwrite", is_flag=True, help="Replace existing databases.")
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

    Example: mnist2db fetch && mnist2db create --backend=lmdb --overwrite
    """
    from .create import create_databases, orientation_note

    check_seed(options)
    note = orientation_note(dataset, as_stored)
    if note and not quiet:
        click.echo(note, err=True)

    bar = _BarPerName(quiet, in_bytes=False)

    def done(result: Any) -> None:
        bar.close()
        if not quiet:
            click.echo(
                f"Wrote {result.path} ({result.backend}): {result.count} records of "
                f"{result.rows}x{result.cols} in {result.seconds:.2f} s."
                + ("" if result.seed is None else f" Shuffled with seed {result.seed}."),
                err=True,
            )

    with library_errors():
        try:
            create_databases(
                dataset,
                data_dir,
                out_dir,
                backend.lower(),
                overwrite=overwrite,
                progress=bar,
                on_database=done,
                transpose=False if as_stored else None,
                **options,
            )
        finally:
            bar.close()
