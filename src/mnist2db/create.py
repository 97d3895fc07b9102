"""create: a fetched dataset turned into both databases, as Caffe's create_mnist.sh makes them."""

from __future__ import annotations

import os
from collections.abc import Callable

from mnist2db.conversion import ConvertResult, convert
from mnist2db.errors import ChecksumError, IdxFormatError
from mnist2db.fetch.catalog import (
    DEFAULT_DATASET,
    PACKING_SUFFIX,
    Dataset,
    default_data_dir,
    default_out_dir,
    get_dataset,
)
from mnist2db.fetch.manifest import read_manifest, verified_present
from mnist2db.fetch.sink import MAX_UNPACKED, packed_bound
from mnist2db.formats.png.encoder import DEFAULT_PNG_COMPRESSION
from mnist2db.progress import NamedProgress, labelled, named_reporting
from mnist2db.selection import fresh_seed
from mnist2db.storage.databases.backends import DEFAULT_BACKEND, DEFAULT_BATCH_SIZE


def orientation_note(dataset: str | Dataset, as_stored: bool) -> str | None:
    """What ``create`` says about the orientation it writes, for a dataset stored
    transposed (EMNIST); None for the others."""
    spec = get_dataset(dataset)
    if not spec.stored_transposed:
        return None
    if as_stored:
        return f"{spec.name}: images kept as stored (transposed: height and width swapped)."
    return (
        f"{spec.name}: images are stored transposed; writing them upright "
        "(--as-stored keeps them as stored)."
    )


def check_fetched(spec: Dataset, path: str, fetched: dict[str, str], again: str) -> None:
    """Refuse ``path`` unless it verifies as :func:`mnist2db.fetch.fetcher.fetch` checks a
    present file: its published digests, else the sha256 recorded in ``fetched``.

    Raises:
        ChecksumError: naming the file and the command that fetches it again.
    """
    name = os.path.basename(path)
    for resource in spec.resources:
        suffix = PACKING_SUFFIX[resource.packing]
        if name == resource.name:
            published, idx = resource.unpacked, resource.idx
            break
        if suffix and name == resource.name + suffix:
            published, idx = resource.gz, False
            break
    else:
        return  # not a file of the dataset (create reads only the dataset's files)
    if verified_present(
        path, published, fetched.get(name), idx=idx, limit=packed_bound(MAX_UNPACKED)
    ):
        return
    raise ChecksumError(
        f"{path}: not the file mnist2db fetch verified (changed since, or never fetched); "
        f"run: {again} (it fetches it again)"
    )


def create_databases(
    dataset: str | Dataset = DEFAULT_DATASET,
    data_dir: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    backend: str = DEFAULT_BACKEND,
    *,
    overwrite: bool = False,
    batch_size: int | None = None,
    progress: NamedProgress | None = None,
    on_database: Callable[[ConvertResult], None] | None = None,
    transpose: bool | None = None,
    label_column: int = 0,
    shuffle: bool = False,
    seed: int | None = None,
    encoded: str | None = None,
    png_compression: str = DEFAULT_PNG_COMPRESSION,
) -> list[ConvertResult]:
    """Convert a fetched dataset into ``mnist_train_<backend>`` and ``mnist_test_<backend>``.

    The same conversion as ``mnist2db convert`` (:func:`mnist2db.conversion.convert`), run
    for each of the dataset's splits (:attr:`Dataset.splits <mnist2db.fetch.catalog.Dataset>`:
    training and test), as Caffe's ``create_mnist.sh`` does. Each input is the unpacked
    file, or its ``.gz`` (or ``.xz``) when only that is present.

    Args:
        dataset: its name gives the default directories.
        data_dir: where the IDX files are; default ``data/<dataset>``.
        out_dir: where the databases go; default ``examples/<dataset>``.
        backend: ``"lmdb"`` or ``"leveldb"``.
        overwrite: replace existing databases.
        batch_size: records per transaction (default: the converter's, 1000).
        progress: called as ``progress(database_path, done, total)``.
        on_database: called with each ``ConvertResult`` once that database is complete.
        transpose: swap height and width; None (default) writes upright images, that is
            transposes the datasets stored transposed (EMNIST,
            :attr:`Dataset.stored_transposed <mnist2db.fetch.catalog.Dataset>`) and no other.
        label_column, shuffle, seed, encoded, png_compression: as
            :func:`mnist2db.conversion.convert` (one seed for every split: a fresh one is
            drawn once when None).

    Returns:
        The ``ConvertResult`` of each split, train then test.

    Raises:
        IdxFormatError: an input is missing (with a hint to run ``mnist2db fetch``) or bad.
        ChecksumError: the directory holds fetch's manifest and an input no longer verifies
            (checked before any work).
        OutputExistsError, BackendError: as :func:`mnist2db.conversion.convert`.
    """
    spec = get_dataset(dataset)
    if transpose is None:
        transpose = spec.stored_transposed
    if shuffle and seed is None:
        seed = fresh_seed()
    data = os.fspath(data_dir) if data_dir is not None else default_data_dir(spec)
    out = os.fspath(out_dir) if out_dir is not None else default_out_dir(spec)
    inputs = []
    for stem, images, labels in spec.splits:
        paths = []
        for name in (images, labels):
            path = os.path.join(data, name)
            for packed in (path + ".gz", path + ".xz"):
                if not os.path.exists(path) and os.path.exists(packed):
                    path = packed
            if not os.path.exists(path):
                raise IdxFormatError(
                    f"{path}: not found (run: mnist2db fetch --dataset {spec.name}"
                    f"{'' if data_dir is None else f' --data {data}'})"
                )
            paths.append(path)
        db = os.path.join(out, f"mnist_{stem}_{backend}")
        inputs.append((paths[0], paths[1], db))
    fetched = read_manifest(data, spec.name)
    if fetched:
        # fetch left these files: each must still be what it verified (a published digest
        # where there is one, else the sha256 it recorded), before any work.
        again = (
            f"mnist2db fetch --dataset {spec.name}{'' if data_dir is None else f' --data {data}'}"
        )
        for images_path, labels_path, _ in inputs:
            for path in (images_path, labels_path):
                check_fetched(spec, path, fetched, again)
    results = []
    for images_path, labels_path, db in inputs:
        result = convert(
            images_path,
            labels_path,
            db,
            backend,
            batch_size=batch_size or DEFAULT_BATCH_SIZE,
            overwrite=overwrite,
            progress=labelled(named_reporting(progress), db),
            transpose=transpose,
            label_column=label_column,
            shuffle=shuffle,
            seed=seed,
            encoded=encoded,
            png_compression=png_compression,
        )
        if on_database is not None:
            on_database(result)
        results.append(result)
    return results
