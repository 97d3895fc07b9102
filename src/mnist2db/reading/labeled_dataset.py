"""An image database and its label database read as one dataset:
``open_db(images, labels=LABELS)[i] -> (image, targets)``.

``targets`` is a fresh float32 vector: the ``float_data`` of the label record stored under
the image record's key (:mod:`mnist2db.labels.databases` writes such pairs; any pair of
databases with the same keys works, a pycaffe-made one too). Each side is a
:class:`~mnist2db.reading.datum_dataset.DatumDataset`, so the images keep every fast path of today's
reader, and the pair keeps its processes and threads rules (pickled without handles,
reopened in a worker, safe under threads and ``close()``). Label records in the layout
pycaffe's ``array_to_datum`` writes are read without protobuf
(:func:`mnist2db.formats.datum.float_datum.decode_targets`).

Opening checks that the two hold as many records, with the same first and last keys;
each read takes the label under the image's own key, so a pair that drifted apart fails
in one line naming the key (``verify IMAGES --labels LABELS`` checks every key).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from mnist2db.errors import DatumError, MissingKeyError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.datum.float_datum import decode_targets, target_layout
from mnist2db.formats.datum.message import key_text

if TYPE_CHECKING:
    from mnist2db.reading.datum_dataset import DatumDataset


class LabeledDataset:
    """Images and their targets, read-only, indexed like a list. Make one with
    ``open_db(images, labels=...)``; ``images`` and ``labels`` are the two datasets."""

    __slots__ = ("images", "labels", "width")

    def __init__(self, images: DatumDataset, labels: DatumDataset) -> None:
        self.images = images
        self.labels = labels
        if len(images) != len(labels):
            raise DatumError(
                f"{labels.path}: {len(labels)} label records for the {len(images)} records "
                f"of {images.path}: not its label database"
            )
        self.width: int | None = None
        if len(images):
            for index in (0, -1):
                key = images.key(index)
                if labels.key(index) != key:
                    raise DatumError(
                        f"{labels.path}: key {key_text(labels.key(index))}, where "
                        f"{images.path} holds {key_text(key)}: not its label database"
                    )
            key = images.key(0)
            value = labels.value(key)
            # The width every record must have: the first's (read by protobuf when it is
            # not in pycaffe's layout: a packed one).
            self.width = target_layout(value) or len(
                decode_targets(value, f"{labels.path}: key {key_text(key)}")
            )

    def targets(self, key: bytes) -> np.ndarray:
        """The targets stored under ``key`` in the label database.

        Raises:
            MissingKeyError: the label database has no such key.
            DatumError: its record is not a label record.
        """
        try:
            value = self.labels.value(key)
        except MissingKeyError:
            raise MissingKeyError(
                f"{self.labels.path}: no label record under the image key {key_text(key)}"
            ) from None
        where = f"{self.labels.path}: key {key_text(key)}"
        targets = decode_targets(value, where, self.width)
        if len(targets) != self.width:
            raise DatumError(
                f"{where}: holds {len(targets)} values, the first record {self.width}: "
                "every record of a label database holds as many"
            )
        return targets

    @overload
    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[np.ndarray, np.ndarray]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[np.ndarray, np.ndarray] | list[tuple[np.ndarray, np.ndarray]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        image = self.images[index][0]
        return image, self.targets(self.images.key(index))

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The records at ``indices`` (PyTorch's batched fetch): the images as the image
        dataset's batched fetch gives them, each with its targets."""
        images = self.images.__getitems__(indices)
        keys = [self.images.key(i) for i in indices]
        return [(image, self.targets(key)) for (image, _), key in zip(images, keys, strict=True)]

    def read_range(self, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Records ``start`` to ``stop`` as one ``(n, c, h, w)`` image array and one
        ``(n, N)`` float32 targets array (bounds as in a slice)."""
        images, _ = self.images.read_range(start, stop)
        begin, end, _ = slice(start, stop).indices(len(self))
        rows = [self.targets(self.images.key(i)) for i in range(begin, end)]
        width = self.width or 0
        return images, (np.stack(rows) if rows else np.empty((0, width), np.float32))

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _, _, image, targets in self.records():
            yield image, targets

    def records(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, bytes, np.ndarray, np.ndarray]]:
        """Stream ``(index, key, image, targets)`` in key order: the images read
        sequentially, each one's targets under its key."""
        for index, key, image, _ in self.images.records(start, stop):
            yield index, key, image, self.targets(key)

    def close(self) -> None:
        """Release both databases' handles (reopened if used again)."""
        self.images.close()
        self.labels.close()

    def __enter__(self) -> LabeledDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"images": self.images, "labels": self.labels, "width": self.width}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        return (
            f"<LabeledDataset {self.images.path!r} + {self.labels.path!r} "
            f"({self.images.backend}, {len(self)} records of {self.width} targets)>"
        )
