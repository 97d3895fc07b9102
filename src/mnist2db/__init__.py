"""mnist2db: MNIST-format IDX files to Caffe Datum databases (LMDB, LevelDB), byte-identical to Caffe.

The names below are imported on first use, so ``import mnist2db`` (and ``mnist2db --help``)
stays fast: numpy, lmdb, plyvel and protobuf load only when a function needs them.
"""

from __future__ import annotations

import importlib

from mnist2db.fastpath import TYPE_CHECKING  # not typing's: see fastpath.py
from mnist2db.version import __version__

#: name -> the module that defines it (a pair: the module and the name there)
_LAZY: dict[str, str | tuple[str, str]] = {
    # the errors, every one a public function may raise
    "ArgumentError": "errors",
    "BackendError": "errors",
    "ChecksumError": "errors",
    "DatumError": "errors",
    "DownloadError": "errors",
    "IdxFormatError": "errors",
    "ImageError": "errors",
    "MissingKeyError": "errors",
    "Mnist2dbError": "errors",
    "OutputError": "errors",
    "OutputExistsError": "errors",
    "RecordIndexError": "errors",
    "RenderError": "errors",
    "VerifyError": "errors",
    # Datum bytes and IDX files
    "array_to_datum": "formats.datum",
    "datum_to_array": "formats.datum",
    "decode_datum": "formats.datum",
    "encode_datum": "formats.datum",
    "IdxHeader": "formats.idx",
    "open_idx": "formats.idx_reader",
    "read_header": "formats.idx_reader",
    "read_idx": "formats.idx_reader",
    # reading databases
    "detect_backend": "storage.backends",
    "iter_db": "storage.readers",
    "open_reader": "storage.readers",
    "DatumDataset": "dataset",
    "open_db": "dataset",
    # the commands' twins: mnist2db CMD ... <-> mnist2db.FUNCTION(...), the same keywords
    "ConvertResult": "conversion",
    "convert": "conversion",  # convert
    "create_databases": "create",  # create
    "FetchedFile": "fetch.results",
    "fetch_dataset": ("fetch.fetcher", "fetch"),  # fetch
    "OwnImagesResult": "images.own_images",
    "convert_images": "images.own_images",  # imageset
    "DbInfo": "info",
    "IdxInfo": "info",
    "describe": "info",  # info
    "VerifyResult": "verify",
    "verify_db": "verify",  # verify
    "verify_label_db": "labels.databases",  # verify --label-db
    "ExportResult": "export",
    "export_db": "export",  # export (--to idx)
    "FilesResult": "exporting.folder",
    "export_files": "exporting.folder",  # export --to files
    "ShardsResult": "exporting.shards",
    "export_webdataset": "exporting.shards",  # export --to webdataset
    "MeanResult": "mean",
    "compute_mean": "mean",
    "mean_image": "mean",  # mean
    "write_mean": "mean",
    "SiameseResult": "siamese",
    "convert_siamese": "siamese",  # siamese
}

__all__ = sorted([*_LAZY, "__version__"])

# The imports below are for type checkers only: ruff cannot see them used via __getattr__.
# ruff: noqa: F401
if TYPE_CHECKING:
    from typing import Any

    from mnist2db.conversion import ConvertResult, convert
    from mnist2db.create import create_databases
    from mnist2db.dataset import DatumDataset, open_db
    from mnist2db.errors import (
        ArgumentError,
        BackendError,
        ChecksumError,
        DatumError,
        DownloadError,
        IdxFormatError,
        ImageError,
        MissingKeyError,
        Mnist2dbError,
        OutputError,
        OutputExistsError,
        RecordIndexError,
        RenderError,
        VerifyError,
    )
    from mnist2db.export import ExportResult, export_db
    from mnist2db.exporting.folder import FilesResult, export_files
    from mnist2db.exporting.shards import ShardsResult, export_webdataset
    from mnist2db.fetch.fetcher import fetch as fetch_dataset
    from mnist2db.fetch.results import FetchedFile
    from mnist2db.formats.datum import array_to_datum, datum_to_array, decode_datum, encode_datum
    from mnist2db.formats.idx import IdxHeader
    from mnist2db.formats.idx_reader import open_idx, read_header, read_idx
    from mnist2db.images.own_images import OwnImagesResult, convert_images
    from mnist2db.info import DbInfo, IdxInfo, describe
    from mnist2db.labels.databases import verify_label_db
    from mnist2db.mean import MeanResult, compute_mean, mean_image, write_mean
    from mnist2db.siamese import SiameseResult, convert_siamese
    from mnist2db.storage.backends import detect_backend
    from mnist2db.storage.readers import iter_db, open_reader
    from mnist2db.verify import VerifyResult, verify_db


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'mnist2db' has no attribute {name!r}")
    module, attribute = where if isinstance(where, tuple) else (where, name)
    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
