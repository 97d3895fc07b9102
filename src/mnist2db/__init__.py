"""mnist2db: MNIST-format IDX files to Caffe Datum databases (LMDB, LevelDB), byte-identical to Caffe.

The names below are imported on first use, so ``import mnist2db`` (and ``mnist2db --help``)
stays fast: numpy, lmdb, plyvel and protobuf load only when a function needs them.
"""

from __future__ import annotations

import importlib

from .startup import TYPE_CHECKING  # not typing's: see startup.py

__version__ = "0.1.0"

_LAZY = {
    "BackendError": "errors",
    "ChecksumError": "errors",
    "DownloadError": "errors",
    "IdxFormatError": "errors",
    "Mnist2dbError": "errors",
    "OutputExistsError": "errors",
    "DatumError": "errors",
    "array_to_datum": "datum",
    "datum_to_array": "datum",
    "decode_datum": "datum",
    "encode_datum": "datum",
    "IdxHeader": "idx",
    "open_idx": "idxreader",
    "read_header": "idxreader",
    "read_idx": "idxreader",
    "ConvertResult": "conversion",
    "convert": "conversion",
    "detect_backend": "backends",
    "iter_db": "readers",
    "open_reader": "readers",
    "DatumDataset": "dataset",
    "open_db": "dataset",
    "MeanResult": "meanfile",
    "compute_mean": "meanfile",
    "write_mean": "meanfile",
    "SiameseResult": "siamese",
    "convert_siamese": "siamese",
}

__all__ = sorted([*_LAZY, "__version__"])

# The imports below are for type checkers only: ruff cannot see them used via __getattr__.
# ruff: noqa: F401
if TYPE_CHECKING:
    from typing import Any

    from .backends import detect_backend
    from .conversion import ConvertResult, convert
    from .dataset import DatumDataset, open_db
    from .datum import array_to_datum, datum_to_array, decode_datum, encode_datum
    from .errors import (
        BackendError,
        ChecksumError,
        DatumError,
        DownloadError,
        IdxFormatError,
        Mnist2dbError,
        OutputExistsError,
    )
    from .idx import IdxHeader
    from .idxreader import open_idx, read_header, read_idx
    from .meanfile import MeanResult, compute_mean, write_mean
    from .readers import iter_db, open_reader
    from .siamese import SiameseResult, convert_siamese


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mnist2db' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
