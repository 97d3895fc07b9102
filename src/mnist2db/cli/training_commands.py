"""What a Caffe training run reads beside the records, as commands: ``mean`` (the mean
image, as compute_image_mean) and ``siamese`` (pair databases, as
convert_mnist_siamese_data). Caffe's own command lines are the drop-ins' (caffe_tools/)."""

from __future__ import annotations

import os

import click

from mnist2db.cli.common import echo, library_errors, progress_reporter
from mnist2db.cli.options import (
    Path,
    backend_choice,
    db_argument,
    images_argument,
    labels_argument,
    out_db_argument,
    overwrite_option,
    quiet_option,
    seed_option,
)
from mnist2db.mean import mean_image
from mnist2db.siamese import convert_siamese
from mnist2db.storage.databases.backends import SIAMESE_BACKEND


@click.command()
@db_argument
@click.argument("out", type=Path(dir_okay=False, path_type=str), required=False)
@overwrite_option("OUT if it exists")
@quiet_option
def mean(db: str, out: str | None, overwrite: bool, quiet: bool) -> None:
    """Compute the mean image of database DB, as Caffe's compute_image_mean, and print
    per-channel mean and standard deviation (the numbers torchvision's Normalize wants).

    OUT.binaryproto (any name but *.npy) gets exactly the bytes compute_image_mean writes;
    OUT.npy the float32 (channels, height, width) mean.

    \b
    Examples:
      mnist2db mean examples/mnist/mnist_train_lmdb examples/mnist/mean.binaryproto
      mnist2db mean examples/mnist/mnist_train_lmdb
    """
    with library_errors():
        result = mean_image(db, out, overwrite=overwrite)
    if quiet:
        return
    channels = " × ".join(map(str, result.mean.shape))
    echo(f"{db}: {result.count} records of {channels} (channels × height × width)")
    for c, (m, s) in enumerate(zip(result.channel_means, result.channel_stds, strict=True)):
        echo(f"channel {c}: mean {m:.4f} std {s:.4f} (0-255); {m / 255:.4f} {s / 255:.4f} (0-1)")
    means = ", ".join(f"{m / 255:.4f}" for m in result.channel_means)
    stds = ", ".join(f"{s / 255:.4f}" for s in result.channel_stds)
    comma = "," if len(result.channel_means) == 1 else ""
    echo(f"Normalize(mean=({means}{comma}), std=({stds}{comma}))")
    if out is not None:
        echo(f"Wrote {out} ({os.path.getsize(out)} bytes).", err=True)


@click.command()
@images_argument
@labels_argument
@out_db_argument
@backend_choice(SIAMESE_BACKEND, "Database to write (Caffe's siamese example reads LevelDB).")
@seed_option("Seed of the random pairs: the same seed gives the same database.  [default: fresh]")
@click.option(
    "--pairs",
    type=click.IntRange(min=0),
    default=None,
    help="Number of pairs.  [default: one per image]",
)
@click.option("--balanced", is_flag=True, help="Make exactly half the pairs same-class.")
@overwrite_option("OUT_DB if it is an existing database")
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

    \b
    Examples:
      mnist2db siamese --seed 1 data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte examples/siamese/mnist_siamese_train_leveldb
      mnist2db siamese --seed 1 --balanced --backend=lmdb data/mnist/t10k-images-idx3-ubyte data/mnist/t10k-labels-idx1-ubyte examples/siamese/mnist_siamese_test_lmdb
    """
    with library_errors(), progress_reporter("Pairing", quiet) as progress:
        result = convert_siamese(
            images,
            labels,
            out_db,
            backend=backend,
            seed=seed,
            pairs=pairs,
            balanced=balanced,
            overwrite=overwrite,
            progress=progress,
        )
    if not quiet:
        echo(result.summary(), err=True)
