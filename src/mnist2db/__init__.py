"""mnist2db: MNIST-format IDX files to Caffe Datum databases (LMDB, LevelDB), byte-identical to Caffe.

The names below are imported on first use, so ``import mnist2db`` (and ``mnist2db --help``)
stays fast: numpy, lmdb, plyvel and protobuf load only when a function needs them.
"""

from __future__ import annotations

import importlib

from mnist2db.fastpath import TYPE_CHECKING  # not typing's: see fastpath.py
from mnist2db.version import __version__

_LAZY = {
    "ArgumentError": "errors",
    "BackendError": "errors",
    "ChecksumError": "errors",
    "DownloadError": "errors",
    "IdxFormatError": "errors",
    "Mnist2dbError": "errors",
    "OutputError": "errors",
    "OutputExistsError": "errors",
    "DatumError": "errors",
    "array_to_datum": "formats.datum",
    "datum_to_array": "formats.datum",
    "decode_datum": "formats.datum",
    "encode_datum": "formats.datum",
    "IdxHeader": "formats.idx",
    "open_idx": "formats.idx_reader",
    "read_header": "formats.idx_reader",
    "read_idx": "formats.idx_reader",
    "ConvertResult": "conversion",
    "convert": "conversion",
    "detect_backend": "storage.backends",
    "iter_db": "storage.readers",
    "open_reader": "storage.readers",
    "DatumDataset": "dataset",
    "open_db": "dataset",
    "MeanResult": "mean",
    "compute_mean": "mean",
    "write_mean": "mean",
    "SiameseResult": "siamese",
    "convert_siamese": "siamese",
}

__all__ = sorted([*_LAZY, "__version__"])

# The imports below are for type checkers only: ruff cannot see them used via __getattr__.
# ruff: noqa: F401
if TYPE_CHECKING:
    from typing import Any

    from mnist2db.conversion import ConvertResult, convert
    from mnist2db.dataset import DatumDataset, open_db
    from mnist2db.errors import (
        ArgumentError,
        BackendError,
        ChecksumError,
        DatumError,
        DownloadError,
        IdxFormatError,
        Mnist2dbError,
        OutputError,
        OutputExistsError,
    )
    from mnist2db.formats.datum import array_to_datum, datum_to_array, decode_datum, encode_datum
    from mnist2db.formats.idx import IdxHeader
    from mnist2db.formats.idx_reader import open_idx, read_header, read_idx
    from mnist2db.mean import MeanResult, compute_mean, write_mean
    from mnist2db.siamese import SiameseResult, convert_siamese
    from mnist2db.storage.backends import detect_backend
    from mnist2db.storage.readers import iter_db, open_reader


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mnist2db' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
