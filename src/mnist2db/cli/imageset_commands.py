"""``mnist2db imageset``: a user's own images (a list or class folders) to Caffe records or
an MNIST IDX pair."""

from __future__ import annotations

import click

from mnist2db.cli.common import check_seed, echo, library_errors, progress_reporter
from mnist2db.cli.options import (
    Path,
    backend_option,
    overwrite_option,
    quiet_option,
    shuffle_options,
)
from mnist2db.errors import printable
from mnist2db.selection import seed_note


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    width, x, height = value.lower().partition("x")
    if not (x and width.isdigit() and height.isdigit() and int(width) and int(height)):
        raise click.BadParameter(f"{value!r} is not WIDTHxHEIGHT (e.g. 28x28)")
    return int(width), int(height)


@click.command()
@click.argument("root", type=Path(path_type=str))
@click.argument("out", type=Path(path_type=str))
@click.option("--list", "listing", type=Path(dir_okay=False, path_type=str),
              help="A Caffe list file (PATH LABEL lines, paths relative to ROOT).  "
                   "[default: ROOT/<class>/<image> folders]")  # fmt: skip
@click.option("--to", type=click.Choice(["db", "idx"]), default="db", show_default=True,
              help="db: a Caffe database; idx: OUT-images-idx3-ubyte and OUT-labels-idx1-ubyte.")  # fmt: skip
@backend_option
@click.option("--gray", is_flag=True, help="Read the images grey (as Caffe's --gray).")
@click.option("--resize", callback=_size, metavar="WxH",
              help="Resize every image to W×H as OpenCV (Caffe's --resize_width/--resize_height).")  # fmt: skip
@click.option("--encoded", type=click.Choice(["file", "png", "jpg", "bmp"]), default=None,
              help="Store encoded images: each file's own bytes (file), or re-encoded as Caffe "
                   "encodes them.  [default: raw pixels]")  # fmt: skip
@click.option("--check-size", is_flag=True, help="Refuse images of different sizes.")
@click.option("--values", type=click.IntRange(min=0), default=None, metavar="N",
              help="The --list lines are PATH V1 … VN (N values; 0: N from the first line): "
                   "the values go to a label database OUT_labels beside OUT.")  # fmt: skip
@click.option("--labels", type=Path(dir_okay=False, path_type=str), default=None,
              help="A label table naming the images (CSV or whitespace with a header row "
                   "path,name1,…, or CelebA's list_attr_celeba.txt): the values go to a label "
                   "database OUT_labels beside OUT.")  # fmt: skip
@shuffle_options
@overwrite_option("OUT if it is what this writes")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes decoding images.  [default: the processors this may use, at most 8]")  # fmt: skip
@click.option("--resume", is_flag=True,
              help="Continue the conversion to OUT that a kill interrupted, from the batches it "
                   "committed (the same arguments; a shuffle takes the staged run's seed).")  # fmt: skip
@quiet_option
def imageset(
    root: str, out: str, listing: str | None, to: str, backend: str, gray: bool,
    resize: tuple[int, int] | None, encoded: str | None, check_size: bool, values: int | None,
    labels: str | None, shuffle: bool, seed: int | None, overwrite: bool, jobs: int | None,
    resume: bool, quiet: bool,
) -> None:  # fmt: skip
    """Convert your own images into a Caffe database (or an MNIST IDX pair).

    With --list, the records are byte for byte Caffe's convert_imageset ROOT/ LIST OUT.
    Without, ROOT holds one folder per class (sorted names are labels 0, 1, ...; hidden
    folders are skipped), and OUT.classes.txt and OUT.list.txt are written beside OUT so
    that --list repeats the run. Images that cannot be read are skipped and named. --to idx
    writes grey images of one size (give --resize otherwise), labels 0-255.

    Several values an image (tags, attributes, regression targets): --list with --values,
    or --labels TABLE; OUT_labels then holds, under OUT's keys and in its order, each
    image's values as pycaffe's array_to_datum writes them (float_data, N × 1 × 1), for a
    second Data layer. An image record's own label is its first value when that is a
    whole number, else 0.

    \b
    Examples:
      mnist2db imageset my_digits/ my_digits_lmdb
      mnist2db imageset --to idx --resize 28x28 my_digits/ my_digits
      mnist2db imageset --list train.txt --gray --shuffle --seed 1 photos/ train_lmdb
      mnist2db imageset --labels list_attr_celeba.txt img_align_celeba/ celeba_lmdb
    """
    from mnist2db.formats.imdecode.image_file import ignore_decoder_warnings
    from mnist2db.formats.imread.cv2_wheel import decoder_note
    from mnist2db.imageset.own_images import convert_images

    ignore_decoder_warnings()
    check_seed({"seed": seed, "shuffle": shuffle})
    skipped: list[str] = []
    with library_errors(), progress_reporter("Converting", quiet, unit="images") as progress:
        done = convert_images(
            root, out, listing=listing, to=to, backend=backend, gray=gray,
            resize=resize, encoded=encoded, check_size=check_size, shuffle=shuffle,
            seed=seed, overwrite=overwrite, progress=progress, jobs=jobs, resume=resume,
            on_stale=lambda path: echo(
                f"{path}: a staged run of a killed conversion: removed (--resume would "
                "continue it)", err=True),
            on_skip=lambda gone: skipped.append(gone.reason), labels=labels, values=values,
        )  # fmt: skip
    if quiet:
        return
    for reason in skipped:
        echo(f"skipped: {reason}", err=True)
    if done.hidden:
        shown = _names(done.hidden, 5)
        echo(f"skipped {len(done.hidden)} hidden folders and files: {shown}", err=True)
    if done.repeated:
        shown = _names(done.repeated, 5)
        echo(f"skipped {len(done.repeated)} links to folders already walked: {shown}", err=True)
    if done.classes:
        echo(f"{len(done.classes)} classes: {_names(done.classes, 10)}", err=True)
    if done.seed is not None:
        echo(seed_note(done.seed), err=True)
    echo(decoder_note(), err=True)
    echo(done.result.summary(), err=True)
    for path in done.extra:
        echo(f"Wrote {path}.", err=True)


def _names(names: tuple[str, ...], most: int) -> str:
    """The first ``most`` names, comma-separated, each on the line it is printed in (a
    newline or an escape in a file name shown as ``\\x0a``, as in the library's messages)."""
    shown = ", ".join(printable(name).replace("\n", "\\x0a") for name in names[:most])
    return shown + (" …" if len(names) > most else "")
