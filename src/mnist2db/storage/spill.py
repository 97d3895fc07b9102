"""Items needed in random order, held on disk instead of in memory.

A writer that visits the source's items out of order (siamese pairs, shuffled conversions)
streams them once into an unlinked temporary file (in its staging directory, so the space
is counted where the database goes and nothing is left behind even after a kill) and
memory-maps it: memory holds a batch, not the dataset.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from mnist2db.errors import BackendError


def spill_to_map(
    batches: Iterable[Any], count: int, item_size: int, directory: str | os.PathLike[str]
) -> Any:
    """Write ``batches`` (bytes-like, ``count`` items of ``item_size`` bytes in all) to an
    unlinked file in ``directory``; return a read-only ``(count, item_size)`` uint8 map of it.

    The file is unlinked at once: the map keeps the space until it is dropped.

    Raises:
        BackendError: the file cannot be written (a full disk), naming ``directory``.
    """
    try:
        with tempfile.TemporaryFile(dir=directory) as spill:
            for batch in batches:
                spill.write(batch)
            spill.flush()
            if count and item_size:
                return np.memmap(spill, dtype=np.uint8, mode="r", shape=(count, item_size))
    except OSError as exc:
        raise BackendError(
            f"{os.fspath(directory)}: cannot hold a temporary copy of the images: "
            f"{exc.strerror or exc}"
        ) from None
    return np.zeros((count, item_size), dtype=np.uint8)
