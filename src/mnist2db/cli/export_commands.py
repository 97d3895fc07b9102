"""``export``: a database written back out, as IDX files, image files or WebDataset shards.

A module of its own, so that an export loads what it writes with and nothing of the
commands that look at the data (``show``'s drawing, ``info``, ``verify``: ~55 ms of an
export's start, the whole of a small one's).
"""

from __future__ import annotations

from typing import Any

import click

from mnist2db.cli.common import echo, library_errors, progress_reporter
from mnist2db.cli.options import Path, db_argument, label_db_option, overwrite_option, quiet_option


@click.command()
@db_argument
@click.argument("out_dir", metavar="OUT", type=Path(path_type=str))
@click.option(
    "--to",
    type=click.Choice(["idx", "files", "webdataset"]),
    default="idx",
    show_default=True,
    help="idx: an IDX image and label pair in OUT; files: one image file per record and "
    "OUT/list.txt (PATH LABEL), as convert_imageset reads them back; webdataset: tar shards "
    "OUT-000000.tar, ... and OUT.shards.json.",
)
@click.option(
    "--prefix",
    default=None,
    help="--to idx: file name stem, PREFIX-images-idx3-ubyte, PREFIX-labels-idx1-ubyte "
    "(default: t10k for a test database, train for a training one).",
)
@click.option(
    "--classes",
    type=Path(dir_okay=False, path_type=str),
    default=None,
    help="--to files and webdataset: class names, one a line in label order, written to "
    "OUT/classes.txt (files) or the manifest (webdataset) (default: DB.classes.txt beside DB, "
    "which imageset writes, if present).",
)
@click.option(
    "--shard-size",
    type=click.IntRange(min=1),
    default=None,
    help="--to webdataset: records a shard holds at most.  [default: 10000]",
)
@click.option(
    "--shard-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="--to webdataset: bytes a shard holds at most (a shard holds at least one record).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="--to webdataset: finish a killed export, after the shards its manifest lists.",
)
@label_db_option(
    "--to files and webdataset: DB's label database (DB_labels: float targets under DB's "
    "keys, checked to be its pair), written to OUT/targets.csv (files) or each sample's "
    "KEY.json (webdataset)."
)
@overwrite_option(
    "existing files of the same names (idx), or an earlier export (files, webdataset)"
)
@quiet_option
def export(db: str, out_dir: str, to: str, prefix: str | None, quiet: bool,
           **options: Any) -> None:  # fmt: skip
    """Write database DB back out: as IDX image and label files (--to idx, into directory
    OUT), as image files and a Caffe list (--to files, directory OUT), or as WebDataset tar
    shards (--to webdataset, OUT-000000.tar, ... beside OUT.shards.json).

    --to idx: for a database made by convert, the files equal the originals byte for
    byte; one made with options (DB/mnist2db.json) is mapped back to its source items: a
    shuffle and a transposition are undone, and the labels are the Datum labels as uint8
    (idx1). The files appear only when both are complete.

    --to files: an encoded record is written as its stored bytes (JPEG, PNG, ..., never
    re-encoded), a raw one as a lossless PNG (grey, or colour with Caffe's BGR as RGB);
    convert_imageset's keys (%08d_PATH) give back their paths, so that convert_imageset
    --encoded OUT/ OUT/list.txt NEW remakes the database; other records go to LABEL/KEY.EXT.
    OUT appears only when complete.

    --to webdataset: the same files as samples KEY.EXT with KEY.cls (the label) and KEY.json
    (the source key, when KEY is not the key; the targets, with --label-db) in shards
    OUT-000000.tar, ...; each shard appears complete or not at all, and OUT.shards.json
    lists their names, counts and SHA-256.

    \b
    Examples:
      mnist2db export examples/mnist/mnist_train_lmdb out/
      mnist2db export --prefix val examples/mnist/mnist_val_lmdb out/
      mnist2db export --to files examples/mnist/mnist_val_lmdb val_images/
      mnist2db export --to webdataset --shard-size 5000 examples/mnist/mnist_val_lmdb shards/val
    """
    if to != "idx" and prefix is not None:
        raise click.UsageError("--prefix names IDX files: it is for --to idx")
    for name in ("classes", "label_db"):
        if to == "idx" and options[name] is not None:
            option = "--" + name.replace("_", "-")
            raise click.UsageError(f"{option} is for --to files and --to webdataset")
    shard_options = ("shard_size", "shard_bytes", "resume")
    for name in shard_options:
        if to != "webdataset" and options[name]:
            raise click.UsageError(f"--{name.replace('_', '-')} is for --to webdataset")
    if options["shard_size"] is None:
        del options["shard_size"]  # the library's default
    if to == "files":
        for name in shard_options:
            options.pop(name, None)
        _export_files(db, out_dir, quiet, options)
        return
    if to == "webdataset":
        _export_shards(db, out_dir, quiet, options)
        return
    from mnist2db.exporting.to_idx import export_db

    with library_errors(), progress_reporter("Exporting", quiet) as progress:
        result = export_db(db, out_dir, prefix=prefix, overwrite=options["overwrite"],
                           progress=progress)  # fmt: skip
    if not quiet:
        echo(
            f"Wrote {result.images} and {result.labels} ({result.count} items, "
            f"{result.rows} × {result.cols}).",
            err=True,
        )
        for note in result.notes:
            echo(f"  {note}", err=True)


def _export_files(db: str, out: str, quiet: bool, options: dict[str, Any]) -> None:
    from mnist2db.exporting.image_files.folder import export_files

    with library_errors(), progress_reporter("Exporting", quiet) as progress:
        result = export_files(db, out, **options, progress=progress)
    if quiet:
        return
    echo(
        f"Wrote {result.out}: {result.count} records as {result.files} files, "
        f"{result.bytes} bytes ({result.encoded} stored bytes as they are, {result.raw} raw "
        "as PNG), and list.txt.",
        err=True,
    )
    if result.restored or result.shared:
        echo(f"  {result.restored + result.shared} at the paths of their convert_imageset keys",
             err=True)  # fmt: skip
    if result.mapped:
        echo(f"  {result.mapped} keys not safe as paths, renamed (renamed.tsv): "
             + "; ".join(result.examples), err=True)  # fmt: skip
    if result.classes:
        echo(f"  {len(result.classes)} class names in classes.txt", err=True)
    if result.targets:
        echo(f"  {result.targets} target values a record in targets.csv", err=True)


def _export_shards(db: str, out: str, quiet: bool, options: dict[str, Any]) -> None:
    from mnist2db.exporting.webdataset.shards import export_webdataset

    with library_errors(), progress_reporter("Exporting", quiet) as progress:
        result = export_webdataset(db, out, **options, progress=progress)
    if quiet:
        return
    shards = len(result.shards)
    echo(
        f"Wrote {shards} shard{'s' if shards != 1 else ''} ({result.count} records, "
        f"{result.bytes} bytes) and {result.manifest}.",
        err=True,
    )
    if result.resumed:
        echo(f"  {result.resumed} records were in the shards of the killed export", err=True)
    if result.mapped:
        echo(f"  {result.mapped} keys are not sample names: mapped, the key in KEY.json", err=True)
    if result.targets:
        echo(f"  {result.targets} target values a record in each KEY.json", err=True)
    if result.classes:
        echo(f"  {len(result.classes)} class names in {result.manifest}", err=True)
