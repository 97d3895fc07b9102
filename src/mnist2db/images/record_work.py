"""One entry of a list to its record, as a worker makes it (:class:`RecordWork`): a plain PNG
read straight into its raw record (:func:`mnist2db.formats.plain_png.plain_record`, no
numpy), every other image by :func:`mnist2db.images.decoding.image_record`, whose decoders
(numpy, Pillow, OpenCV) are loaded by the first image that needs them, or before the
workers fork when the run will (:meth:`RecordWork.preload`).

This module is what the parent of the workers loads to hand them their work: the MNIST-size
PNG lists that spend most of their time starting up load neither numpy nor OpenCV.
"""

from __future__ import annotations

import gc

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.image_list import ListEntry
from mnist2db.formats.image_types import encoding_of
from mnist2db.formats.opencv import opencv
from mnist2db.formats.plain_png import plain_record
from mnist2db.formats.png import PNG_SIGNATURE
from mnist2db.images.process_setup import one_blas_thread

if TYPE_CHECKING:
    from collections.abc import Callable


class RecordWork:
    """An entry to its record (picklable, for worker processes)."""

    def __init__(
        self,
        root: bytes,
        color: bool,
        resize: tuple[int, int] | None,
        encoded: bool,
        encode_type: str | None,
    ) -> None:
        self.root, self.color, self.resize = root, color, resize
        self.encoded, self.encode_type = encoded, encode_type
        # Raw records of unresized images: a plain PNG's are its samples as they are.
        self.plain = resize is None and not encoded

    def __call__(self, entry: ListEntry) -> tuple[bytes | bytearray, tuple[int, int, int]]:
        if self.plain:
            made = plain_record(self.root + entry.path, self.color, entry.label)
            if made is not None:
                return made
        from mnist2db.images.decoding import image_record

        encoding = encoding_of(entry, self.encode_type) if self.encoded else None
        return image_record(
            entry, root=self.root, color=self.color, resize=self.resize, encoding=encoding
        )

    def warm_up(self, first: ListEntry | None) -> Callable[[], None] | None:
        """What each worker loads as it starts, before its first task (:func:`load_decoders`),
        or None: nothing, when the run is of raw, unresized records and its ``first`` image a
        PNG (a list of MNIST-size PNGs: each worker loads Pillow's core with its first image,
        and only what a later image needs)."""
        if self.plain and first is not None and _begins_as_png(self.root + first.path):
            return None
        return load_decoders


def load_decoders() -> None:
    """Load the decoders the full path uses in this process, a worker as it starts, without
    OpenBLAS's thread pools: numpy and OpenCV, or where OpenCV is not used, Pillow and its
    plugins (with OpenCV, Pillow is loaded by the first image that needs it: one that is not
    a plain JPEG; it would cost each worker ~0.05 s of CPU before its first image). The
    collector skips what they made from then on (it lives as long as the worker)."""
    with one_blas_thread():
        import mnist2db.images.decoding  # noqa: F401 (numpy, the resize, the encoders)

        if opencv() is None:
            from PIL import Image

            Image.preinit()
    gc.freeze()


def _begins_as_png(path: bytes) -> bool:
    try:
        with open(path, "rb") as image:
            return image.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
    except OSError:
        return False
