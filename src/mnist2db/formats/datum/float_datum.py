"""Label records: a vector of ``N`` float32 targets as the ``float_data`` Datum pycaffe makes.

What users write by hand beside an image database, and Caffe's second ``Data`` layer reads,
is ``caffe.io.array_to_datum(np.asarray(values, dtype=float).reshape(N, 1, 1))``
serialized: ``channels N, height 1, width 1`` and ``float_data``, no ``data``, no
``label``. ``float_data`` is caffe.proto's ``repeated float float_data = 6``, a proto2
field without ``[packed = true]``, so protobuf writes it unpacked, one tag per value::

    08 <N> 10 01 18 01 (35 <float32, little-endian>) × N

(each number a varint). The values pass through float64 (``dtype=float``) to the float32
field, so a decimal is rounded once to a double and then to the nearest float32, as here.
:func:`encode_target_batch` writes that layout with numpy, a batch at a time, without a
message per record; the tests prove the bytes equal protoc's ``caffe_pb2`` serializing
``array_to_datum`` for any values. :func:`decode_targets` reads one back without protobuf
when it is in that layout, and any ``float_data`` Datum (packed, other shapes) through
protobuf.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mnist2db.errors import DatumError
from mnist2db.formats.datum.message import datum_shape, decode_datum
from mnist2db.formats.protowire import encode_varint

#: ``float_data``'s tag: field 6, wire type 5 (32-bit).
FLOAT_TAG = 0x35
_CELL = np.dtype([("tag", "u1"), ("value", "<f4")])  # 5 bytes, no padding
_FLOAT32 = np.dtype("<f4")
#: ``width -> (prefix, tags)`` of the layouts read (a database has one width).
_layouts: dict[int, tuple[bytes, bytes]] = {}


def target_prefix(width: int) -> bytes:
    """The bytes before the values: ``channels width, height 1, width 1``."""
    return b"\x08" + encode_varint(width) + b"\x10\x01\x18\x01"


def target_value_size(width: int) -> int:
    """The bytes of one label record of ``width`` values."""
    return len(target_prefix(width)) + 5 * width


def encode_target_batch(values: np.ndarray) -> list[bytes]:
    """One label record per row of ``values`` (an ``(n, N)`` array, any float dtype: each
    value is rounded to float32 as protobuf rounds it), byte-identical to
    ``array_to_datum(row.astype(float).reshape(N, 1, 1)).SerializeToString()``."""
    rows = np.asarray(values, np.float64).astype(np.float32)
    if rows.ndim != 2 or not rows.shape[1]:
        raise ValueError(f"encode_target_batch needs an (n, N) array with N ≥ 1, got {rows.shape}")
    n, width = rows.shape
    prefix = np.frombuffer(target_prefix(width), np.uint8)
    record = len(prefix) + 5 * width
    layout = np.empty((n, record), np.uint8)
    layout[:, : len(prefix)] = prefix
    cells = layout[:, len(prefix) :].view(_CELL) if n else np.empty((0, width), _CELL)
    cells["tag"] = FLOAT_TAG
    cells["value"] = rows
    flat = layout.tobytes()
    return [flat[i * record : (i + 1) * record] for i in range(n)]


def encode_targets(values: Any) -> bytes:
    """One label record of the vector ``values`` (see :func:`encode_target_batch`)."""
    return encode_target_batch(np.asarray(values, np.float64).reshape(1, -1))[0]


def target_layout(value: bytes) -> int | None:
    """The width ``N`` when ``value`` is a label record in the layout above (what
    :func:`decode_targets` reads without protobuf), else None."""
    try:
        datum = decode_datum(value)
    except DatumError:
        return None
    width = len(datum.float_data)
    if not width or datum.HasField("data") or datum.HasField("label") or datum.encoded:
        return None
    if value != encode_targets(np.array(datum.float_data, np.float32)):
        return None
    return width


def decode_targets(value: bytes, where: str = "", width: int | None = None) -> np.ndarray:
    """The float32 vector a label record holds: ``float_data`` of any raw Datum, flattened
    in channel, height, width order (:func:`datum_shape` checks it).

    ``width``: the width of the database's first record; a record in exactly that layout
    is read without protobuf.

    Raises:
        DatumError: naming ``where``: not a Datum, or one without ``float_data``.
    """
    if width is not None:
        layout = _layouts.get(width)
        if layout is None:
            if len(_layouts) > 8:
                _layouts.clear()
            layout = _layouts[width] = (target_prefix(width), bytes([FLOAT_TAG]) * width)
        prefix, tags = layout
        start = len(prefix)
        # One tag before each float: the layout, checked by one slice.
        if len(value) == start + 5 * width and value.startswith(prefix) and value[start::5] == tags:
            return np.ndarray((width,), _FLOAT32, value, start + 1, (5,)).copy()
    prefix_where = f"{where}: " if where else ""
    try:
        datum = decode_datum(value)
    except DatumError as exc:  # named by the database and the key
        raise DatumError(f"{prefix_where}not a label record: {exc}") from None
    if datum.encoded or len(datum.data) or not len(datum.float_data):
        raise DatumError(
            f"{prefix_where}not a label record: a Datum of float_data values "
            "(this one holds image data)"
        )
    datum_shape(datum, where)
    return np.array(datum.float_data, np.float32)
