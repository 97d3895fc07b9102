"""A plain conversion's batch of Caffe Datum records laid out once as the records' digest
frames them (:data:`mnist2db.storage.record_digest.DIGEST_METHOD`): the digest hashes the
buffer the encoder built, and the records are cut from it."""

from __future__ import annotations

import struct

from mnist2db.formats.datum.message import KEY_LIMIT, datum_prefix, record_keys, splitter


def encode_raw_framed(
    pixels: bytes | bytearray | memoryview,
    labels: bytes | bytearray | memoryview,
    rows: int,
    cols: int,
    start: int,
) -> tuple[bytearray, list[tuple[bytes, bytes]]] | None:
    """:func:`~mnist2db.formats.datum.message.encode_raw_batch`'s records under Caffe's keys from
    ``start``, laid out in one buffer as the records' digest frames them (``>I`` key length, key, ``>I`` value length,
    value: :data:`mnist2db.storage.record_digest.DIGEST_METHOD`), and the ``(key, value)``
    pairs cut from it: the digest hashes the buffer the encoder built, nothing framed again.

    Returns None when a label is 128 or more (two varint bytes: the records' lengths
    differ) or the keys pass :data:`KEY_LIMIT`; :func:`encode_raw_batch` then.
    """
    size = rows * cols
    labels = bytes(labels)
    n = len(labels)
    view = memoryview(pixels).cast("B")
    if len(view) != n * size:
        raise ValueError(f"{len(view)} pixel bytes for {n} images of {rows} × {cols}")
    if n == 0 or max(labels) >= 0x80 or start + n > KEY_LIMIT:
        return None
    prefix = datum_prefix(1, rows, cols, size)
    value_length = len(prefix) + size + 2
    key_frame = struct.pack(">I", 8)
    head = key_frame + b"\0" * 8 + struct.pack(">I", value_length) + prefix  # 16 + prefix
    frame = 16 + value_length
    keys = record_keys(start, n)
    layout = bytearray(head)
    layout += (b"\x28\x00" + head).join(splitter(size, n).unpack(view))
    layout += b"\x28\x00"
    layout[frame - 1 :: frame] = labels
    joined = b"".join(keys)
    for digit in range(8):  # each of the keys' 8 columns in one strided assignment
        layout[4 + digit :: frame] = joined[digit::8]
    values = _value_cutter(value_length, n).unpack(layout)
    return layout, list(zip(keys, values, strict=True))


def _value_cutter(length: int, count: int) -> struct.Struct:
    """A ``struct.Struct`` cutting ``count`` framed records into their values."""
    key = (length, count)
    found = _CUTTERS.get(key)
    if found is None:
        if len(_CUTTERS) > 8:
            _CUTTERS.clear()
        found = _CUTTERS[key] = struct.Struct(f"16x{length}s" * count)
    return found


_CUTTERS: dict[tuple[int, int], struct.Struct] = {}
