"""Decoded entries to the batches of ``(key, value)`` records the writer commits
(:func:`record_batches`), bounded by records and by bytes: the one place where an image's
record gets its key (Caffe's ``%08d_PATH``), whether it came alone or in a run of records
(:class:`~mnist2db.images.worker_messages.Run`); and the refusal of an image of another
size than the first (:func:`other_size`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from mnist2db.errors import ImageError, printable
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.image_list import ListEntry, image_key
from mnist2db.images.worker_messages import Run
from mnist2db.storage.record_digest import FramedItems

if TYPE_CHECKING:
    from typing import Any

#: Bytes of records per transaction at most (a batch also stops at ``batch_size`` records):
#: LMDB holds a transaction's dirty pages in memory until it commits, and the workers wait
#: on their pipes while it does (4 MiB: ~10 ms here, the 1 MiB a pipe holds; 16 MiB held
#: 25 MiB more, at the same CPU).
BATCH_BYTES = 4 << 20


def record_batches(
    decoded: Iterable[tuple[ListEntry, Any] | Run],
    check_size: bool,
    batch_size: int,
    state: dict[str, Any],
    skip: Callable[[ListEntry, str], None],
    where: str,
    first: tuple[ListEntry, tuple[int, int, int]] | None = None,
    release: Callable[[], None] | None = None,
) -> Iterator[list[tuple[bytes, bytes]]]:
    """``(key, value)`` batches of at most ``batch_size`` records or :data:`BATCH_BYTES`: the
    one place where a record's key and value are made (a label database written beside
    would take its record here, under the same key). ``decoded``: each entry with its
    result, or a :class:`~mnist2db.images.worker_messages.Run` of records under their keys
    (taken whole, or split where a batch ends, as its records one by one would be).
    ``release``: called when a batch yielded is written (the next one asked for), its
    values read no more. A batch is a :class:`FramedItems`: its digest's framing too, when
    every record came in a run."""
    batch = FramedItems()
    size = 0

    for item in decoded:
        if isinstance(item, Run):
            shape = item.shape
            if first is None:
                first = (item.entries[0], shape)
                state["shape"] = shape
            elif shape != first[1]:
                state["mixed"] = True
                if check_size:
                    raise other_size(where, item.entries[0], shape, *first,
                                     "--check_size: every image one size; or give a resize")  # fmt: skip
            pairs, framed, value_size = item.pairs, item.framed, max(1, item.value_size)
            frame = len(framed) // item.count
            while pairs:
                # The records that end the batch: batch_size of them, or the one that
                # reaches BATCH_BYTES.
                room = min(batch_size - len(batch), -(-(BATCH_BYTES - size) // value_size))
                take = min(len(pairs), max(1, room))
                batch.extend(pairs[:take] if take < len(pairs) else pairs)
                if batch.framed is not None:
                    batch.framed.append(framed[: take * frame])
                size += take * item.value_size
                state["count"] += take
                pairs, framed = pairs[take:], framed[take * frame :]
                if len(batch) >= batch_size or size >= BATCH_BYTES:
                    yield batch
                    batch, size = FramedItems(), 0
                    if release is not None:
                        release()
            continue
        entry, record = item
        if isinstance(record, str):
            skip(entry, record)
            continue
        value, shape = record
        if first is None:
            first = (entry, shape)
            state["shape"] = shape
        elif shape != first[1]:
            state["mixed"] = True
            if check_size:
                raise other_size(where, entry, shape, *first,
                                  "--check_size: every image one size; or give a resize")  # fmt: skip
        batch.append((image_key(entry), value))
        batch.framed = None  # the digest frames it
        size += len(value)
        state["count"] += 1
        if len(batch) >= batch_size or size >= BATCH_BYTES:
            yield batch
            batch, size = FramedItems(), 0
            if release is not None:
                release()
    if batch:
        yield batch


def other_size(where: str, entry: ListEntry, shape: tuple[int, ...], first: ListEntry,
               first_shape: tuple[int, ...], hint: str) -> ImageError:  # fmt: skip
    """An image of another size than the first one, in one line naming both."""
    return ImageError(
        f"{where}:{entry.line + 1}: {printable(os.fsdecode(entry.path))} is "
        + " × ".join(map(str, shape))
        + f", the first image ({printable(os.fsdecode(first.path))}) "
        + " × ".join(map(str, first_shape))
        + f" ({hint})"
    )
