"""Image files to an MNIST IDX pair (``imageset --to idx``): grey, one size, labels 0-255,
both files placed together or neither. The entries are checked and decoded as for a
database (:mod:`mnist2db.imageset.to_database`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from mnist2db.errors import ImageError, Mnist2dbError, OutputError
from mnist2db.formats.idx.header import IMAGES_MAGIC, LABELS_MAGIC, pack_header
from mnist2db.formats.imdecode.image_file import check_resize
from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.imageset.batches import other_size
from mnist2db.imageset.decoding import PixelWork
from mnist2db.imageset.to_database import (
    Entries,
    ImagesetResult,
    Skipped,
    check_entries,
    check_jobs,
)
from mnist2db.imageset.workers.pool import decode_in_order
from mnist2db.progress import Progress, reporting
from mnist2db.storage.destinations import check_apart
from mnist2db.storage.file_placement import check_file_target, place_together
from mnist2db.storage.files import AtomicFile


def write_imageset_idx(
    root: str | bytes,
    entries: Entries,
    prefix: str,
    *,
    resize: tuple[int, int] | None = None,
    overwrite: bool = False,
    where: str = "list",
    inputs: Iterable[str] = (),
    progress: Progress | None = None,
    on_skip: Callable[[Skipped], None] | None = None,
    jobs: int | None = None,
) -> ImagesetResult:
    """Write the images ``entries()`` names as an MNIST pair, ``PREFIX-images-idx3-ubyte``
    and ``PREFIX-labels-idx1-ubyte``: grey (as OpenCV reads grey), all one size (or
    ``resize``), labels 0-255. Both files appear together, complete, or neither.

    Raises:
        Mnist2dbError: a target may not be written, a label outside 0-255, an image of
            another size, no image readable; nothing is then written.
    """

    progress = reporting(progress)
    started = time.perf_counter()
    root_bytes = os.fsencode(root)
    targets = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    for target in targets:
        check_file_target(target, overwrite, list(inputs))
    jobs = check_jobs(jobs)
    check_resize(resize, 1)
    total = check_entries(entries(), root=root_bytes, backend="idx", encoded=False,
                          encode_type=None, resize=resize, where=where)  # fmt: skip
    if overwrite:  # a target replaced may not be one of the images (a list may name ../)
        for target in (t for t in targets if os.path.lexists(t)):
            check_apart(target, (os.fsdecode(root_bytes + e.path) for e in entries()))
    for entry in entries():
        if not 0 <= entry.label <= 255:
            raise Mnist2dbError(
                f"{where}:{entry.line + 1}: label {entry.label}: an idx1 label file holds "
                "0 … 255 (write a database instead)"
            )

    skipped: list[Skipped] = []
    count = 0
    first: tuple[ListEntry, tuple[int, ...]] | None = None
    try:
        with AtomicFile(targets[0]) as images, AtomicFile(targets[1]) as labels:
            images.write(pack_header(IMAGES_MAGIC, 0, 0, 0))
            labels.write(pack_header(LABELS_MAGIC, 0))
            for entry, image in decode_in_order(
                entries(), PixelWork(root_bytes, resize), root_bytes, jobs
            ):
                if isinstance(image, str):
                    skipped.append(Skipped(entry, image))
                    if on_skip is not None:
                        on_skip(skipped[-1])
                    continue
                if first is None:
                    first = (entry, image.shape)
                elif image.shape != first[1]:
                    raise other_size(where, entry, image.shape, *first,
                                      "an IDX file holds one size: give a resize")  # fmt: skip
                images.write(image.tobytes())
                labels.write(bytes((entry.label,)))
                count += 1
                if count % 1000 == 0:
                    progress(count, total)
            if first is None:
                raise ImageError(f"{where}: no image could be read; nothing written")
            images.stream.seek(0)
            images.write(pack_header(IMAGES_MAGIC, count, *first[1]))
            labels.stream.seek(0)
            labels.write(pack_header(LABELS_MAGIC, count))
            place_together([images, labels])
    except OSError as exc:
        raise OutputError(f"{exc.filename or prefix}: cannot write: {exc.strerror}") from None
    progress(count, total)
    return ImagesetResult(
        path=targets[0], backend="idx", count=count, lines=total, skipped=tuple(skipped),
        shape=(1, int(first[1][0]), int(first[1][1])), seconds=time.perf_counter() - started,
    )  # fmt: skip
