"""Caffe ``Datum`` messages: a fast fixed-layout encoder, and pycaffe-style array helpers.

Caffe's ``convert_mnist_data`` sets ``channels``, ``height``, ``width``, ``data`` and
``label`` on a proto2 ``Datum`` and serializes it. Fields are written in field-number
order, every set field is written (a label of 0 included), so the bytes are::

    08 <channels> 10 <height> 18 <width> 22 <len(data)> <data> 28 <label>

with each number a protobuf varint. :func:`encode_datum` and :func:`encode_raw_batch` write that
layout directly, without a message object per record; the tests prove the bytes equal
``Datum.SerializeToString()`` for every shape and label.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from mnist2db.errors import DatumError, Mnist2dbError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.protowire import encode_varint

if TYPE_CHECKING:
    from typing import Any

    import numpy as np


def datum_prefix(channels: int, height: int, width: int, data_length: int) -> bytes:
    """The bytes that precede ``data`` in a serialized Datum."""
    return (
        b"\x08"
        + encode_varint(channels)
        + b"\x10"
        + encode_varint(height)
        + b"\x18"
        + encode_varint(width)
        + b"\x22"
        + encode_varint(data_length)
    )


def encode_datum(data: bytes, channels: int, height: int, width: int, label: int) -> bytes:
    """Serialize ``Datum(channels, height, width, data, label)`` exactly as protobuf would."""
    return datum_prefix(channels, height, width, len(data)) + data + b"\x28" + encode_varint(label)


#: ``0x28`` (field 5, varint) followed by the label's varint, for every uint8 label.
_LABEL_TAILS = [b"\x28" + encode_varint(label) for label in range(256)]


def encode_raw_batch(
    pixels: bytes | bytearray | memoryview,
    labels: bytes | bytearray | memoryview,
    rows: int,
    cols: int,
) -> list[bytes]:
    """Serialize one Datum per image from raw IDX bytes, without numpy.

    The converter's hot path: ``channels=1, height=rows, width=cols``, image ``i`` being
    ``pixels[i * rows * cols : (i + 1) * rows * cols]`` and its label the uint8 ``labels[i]``.

    Args:
        pixels: ``n × rows × cols`` uint8 pixels, image after image (any bytes-like object).
        labels: ``n`` uint8 labels.

    Returns:
        ``n`` serialized Datum values, byte-identical to ``SerializeToString()``.
    """
    size = rows * cols
    labels = bytes(labels)
    n = len(labels)
    view = memoryview(pixels).cast("B")
    if len(view) != n * size:
        raise ValueError(f"{len(view)} pixel bytes for {n} images of {rows} × {cols}")
    prefix = datum_prefix(1, rows, cols, size)
    if n == 0:
        return []
    if max(labels) < 0x80:
        # Every label is a one-byte varint, so every record has one length. The batch is
        # laid out in one buffer (the images joined by the bytes between them, the labels
        # patched in by one strided assignment) and cut into records; struct does the
        # cutting, so no Python bytecode runs per record.
        head = len(prefix)
        length = head + size + 2
        layout = bytearray(prefix)
        layout += (b"\x28\x00" + prefix).join(splitter(size, n).unpack(view))
        layout += b"\x28\x00"
        layout[head + size + 1 :: length] = labels
        return list(splitter(length, n).unpack(layout))
    tails = _LABEL_TAILS
    return [
        b"".join((prefix, view[i * size : (i + 1) * size], tails[label]))
        for i, label in enumerate(labels)
    ]


def encode_batch(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Serialize one Datum per image: ``channels=1``, ``height, width = images.shape[1:]``.

    The numpy face of :func:`encode_raw_batch` (the one encoder), with labels of any int32
    value (QMNIST's label columns) written as their varints.

    Args:
        images: uint8 array of shape ``(n, rows, cols)``.
        labels: integer array of shape ``(n,)``; each value is written as the Datum label.

    Returns:
        ``n`` serialized Datum values, byte-identical to ``SerializeToString()``.
    """
    import numpy as np

    n, rows, cols = images.shape
    if n and (int(labels.min()) < 0 or int(labels.max()) > 0xFF):
        prefix = datum_prefix(1, rows, cols, rows * cols)
        flat = images.reshape(n, rows * cols)
        return [
            prefix + flat[i].tobytes() + b"\x28" + encode_varint(int(labels[i])) for i in range(n)
        ]
    return encode_raw_batch(
        images.astype(np.uint8).tobytes(), labels.astype(np.uint8).tobytes(), rows, cols
    )


# -- Caffe's keys ------------------------------------------------------------------------------

#: Caffe's keys are ``"%08d" % i``: from 10**8 records on they grow a digit and stop sorting
#: in index order, so LMDB's append mode, and reading record ``i`` under ``record_key(i)``,
#: hold only up to this many records.
KEY_LIMIT = 10**8
#: Caffe's key format, for code that formats keys inline (the dataset's hot path); everything
#: else calls :func:`record_key` or :func:`record_keys`.
KEY_FORMAT = b"%08d"
#: A Datum's height, width and data length are int32 fields.
INT32_MAX = (1 << 31) - 1


def check_record_count(count: int, where: str, unit: str = "records") -> None:
    """Refuse, before any work, a database of more records than Caffe's keys hold: every
    writer calls it as soon as it knows how many records it will write (the one owner of
    the limit; a run past it would fill the disk with records no key order can serve).

    Raises:
        Mnist2dbError: naming ``where`` (the source or the destination) and the count.
    """
    if count > KEY_LIMIT:
        raise Mnist2dbError(
            f"{where}: {count} {unit}, more than the {KEY_LIMIT} records a database can hold "
            f'(Caffe\'s "%08d" keys stop sorting in record order after {KEY_LIMIT - 1})'
        )


_TRIPLES = [b"%03d" % i for i in range(1000)]


def raw_layout(value: bytes) -> tuple[int, bytes, tuple[int, int, int], int] | None:
    """``(length, prefix, shape, pixels offset)`` of a record in Caffe's fixed layout
    (``channels, height, width, data, label`` with a one-byte label), else None: every
    record of that length that begins with ``prefix`` and ends ``28 <label below 128>``
    holds its pixels at ``offset`` (what :mod:`mnist2db.dataset` reads without protobuf)."""
    try:
        datum = decode_datum(value)
    except DatumError:
        return None
    shape = (int(datum.channels), int(datum.height), int(datum.width))
    size = shape[0] * shape[1] * shape[2]
    if min(shape) <= 0 or len(datum.data) != size or datum.encoded or len(datum.float_data):
        return None
    label = int(datum.label)
    if not 0 <= label < 0x80 or value != encode_datum(datum.data, *shape, label):
        return None
    prefix = datum_prefix(*shape, size)
    return len(value), prefix, shape, len(prefix)


def record_key(index: int) -> bytes:
    """Caffe's key for record ``index``: ``b"%08d" % index``."""
    return KEY_FORMAT % index


def key_text(key: bytes) -> str:
    """A key as messages show it: printable ASCII, every other byte escaped (``\\xff``,
    ``\\x1b``): a key is any bytes, and a control character (a newline, a terminal's
    escape sequence) would break a message's one line or act on the terminal."""
    text = key.decode("ascii", errors="backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def record_keys(start: int, count: int) -> Sequence[bytes]:
    """The keys ``b"%08d" % i`` for ``i`` in ``range(start, start + count)``, as Caffe writes them.

    Built a thousand at a time from five leading digits joined onto the precomputed last
    three, and cut by struct: about five times faster than formatting each key.
    """
    end = start + count
    if end > KEY_LIMIT:
        return [KEY_FORMAT % i for i in range(start, end)]
    parts = []
    i = start
    while i < end:
        block, low = divmod(i, 1000)
        stop = min(end, (block + 1) * 1000)
        head = b"%05d" % block
        parts.append(head + head.join(_TRIPLES[low : low + stop - i]))
        i = stop
    return splitter(8, count).unpack(b"".join(parts))


_SPLITTERS: dict[tuple[int, int], struct.Struct] = {}


def splitter(size: int, count: int) -> struct.Struct:
    """A ``struct.Struct`` whose ``unpack`` cuts ``count × size`` bytes into ``count`` objects."""
    key = (size, count)
    found = _SPLITTERS.get(key)
    if found is None:
        if len(_SPLITTERS) > 8:  # a batch size and the last, shorter batch: a few suffice
            _SPLITTERS.clear()
        found = _SPLITTERS[key] = struct.Struct(f"{size}s" * count)
    return found


#: Caffe's messages that mnist2db reads and writes, as ``(name, fields)``; each field is
#: ``(name, number, label, type, default, packed, message type)``, in caffe.proto's order.
#: proto/datum.proto is the same text for protoc; tests/test_proto.py checks they agree.
_MESSAGES: tuple[tuple[str, tuple[tuple[str, int, str, str, str | None, bool, str], ...]], ...] = (
    ("BlobShape", (("dim", 1, "repeated", "int64", None, True, ""),)),
    (
        "BlobProto",
        (
            ("shape", 7, "optional", "message", None, False, ".caffe.BlobShape"),
            ("data", 5, "repeated", "float", None, True, ""),
            ("diff", 6, "repeated", "float", None, True, ""),
            ("double_data", 8, "repeated", "double", None, True, ""),
            ("double_diff", 9, "repeated", "double", None, True, ""),
            ("num", 1, "optional", "int32", "0", False, ""),
            ("channels", 2, "optional", "int32", "0", False, ""),
            ("height", 3, "optional", "int32", "0", False, ""),
            ("width", 4, "optional", "int32", "0", False, ""),
        ),
    ),
    (
        "Datum",
        (
            ("channels", 1, "optional", "int32", None, False, ""),
            ("height", 2, "optional", "int32", None, False, ""),
            ("width", 3, "optional", "int32", None, False, ""),
            ("data", 4, "optional", "bytes", None, False, ""),
            ("label", 5, "optional", "int32", None, False, ""),
            ("float_data", 6, "repeated", "float", None, False, ""),
            ("encoded", 7, "optional", "bool", "false", False, ""),
        ),
    ),
)


def file_descriptor() -> Any:
    """Caffe's messages as a ``FileDescriptorProto``: what protoc makes of proto/datum.proto."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="datum.proto", package="caffe")
    field_type = descriptor_pb2.FieldDescriptorProto
    for message_name, fields in _MESSAGES:
        message = proto.message_type.add(name=message_name)
        for name, number, label, kind, default, packed, type_name in fields:
            field = message.field.add(
                name=name,
                number=number,
                label=field_type.Label.Value(f"LABEL_{label.upper()}"),
                type=field_type.Type.Value(f"TYPE_{kind.upper()}"),
                json_name=name.split("_")[0] + "".join(p.title() for p in name.split("_")[1:]),
            )
            if type_name:
                field.type_name = type_name
            if default is not None:
                field.default_value = default
            if packed:
                field.options.packed = True
    return proto


def message_type(name: str) -> Any:
    """The message class ``caffe.<name>`` (``Datum``, ``BlobShape``, ``BlobProto``).

    The classes are built at run time from :func:`file_descriptor` in a descriptor pool of
    mnist2db's own, not protobuf's default pool. Two reasons, written here once: protoc's
    generated code is locked to the protobuf release that made it (mnist2db supports 3.20
    to 7.x), and a ``caffe.Datum`` in the default pool would collide with pycaffe's
    ``caffe_pb2`` whichever is imported second. Both decode the same bytes to the same fields.

    Raises:
        KeyError: no such message.
    """
    if not _MESSAGE_TYPES:
        from google.protobuf import descriptor_pool

        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(file_descriptor().SerializeToString())
        for message_name, _ in _MESSAGES:
            descriptor = pool.FindMessageTypeByName(f"caffe.{message_name}")
            _MESSAGE_TYPES[message_name] = _message_class(descriptor)
    return _MESSAGE_TYPES[name]


def _message_class(descriptor: Any) -> Any:
    from google.protobuf import message_factory

    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:  # protobuf >= 4.21
        return get_class(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


_MESSAGE_TYPES: dict[str, Any] = {}


def datum_type() -> Any:
    """The ``caffe.Datum`` message class (see :func:`message_type`)."""
    return message_type("Datum")


def decode_datum(value: bytes) -> Any:
    """Parse a serialized Datum into a ``caffe.Datum`` protobuf message.

    Raises:
        DatumError: the bytes are not a valid Datum message.
    """
    from google.protobuf.message import DecodeError

    datum = datum_type()()
    try:
        datum.ParseFromString(value)
    except DecodeError as exc:
        raise DatumError(f"value of {len(value)} bytes is not a Datum: {exc}") from None
    return datum


def array_to_datum(arr: np.ndarray, label: int | None = None) -> Any:
    """Make a Datum from a ``(channels, height, width)`` array, as pycaffe's ``caffe.io`` does.

    uint8 arrays go to ``data``; any other dtype to ``float_data``.

    Raises:
        ValueError: the array is not three-dimensional.
    """
    import numpy as np

    if arr.ndim != 3:
        raise ValueError(
            f"array_to_datum needs a 3-D (channels, height, width) array, got {arr.shape}"
        )
    datum = datum_type()()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = int(label)
    return datum


def _is_empty(datum: Any) -> bool:
    return not (
        datum.channels or datum.height or datum.width or len(datum.data) or len(datum.float_data)
    )


def check_datum(datum: Any, where: str = "") -> None:
    """Check that a raw Datum's fields describe an image (:func:`datum_shape`); an encoded
    Datum's image is checked when it is decoded (:mod:`mnist2db.formats.png_codec`).

    Every reader checks a record so before using its fields, so that what a database
    holds, however made, is read or refused in one line, never a numpy error.

    Raises:
        DatumError: naming ``where`` (the database and the key) and what is wrong.
    """
    if not datum.encoded:
        datum_shape(datum, where)


def datum_shape(datum: Any, where: str = "") -> tuple[int, int, int]:
    """The shape of a raw (not encoded) Datum, checked as Caffe's data layer takes one:
    ``channels`` at least 1, ``height`` and ``width`` at least 0, at most 2^31-1 values
    (Caffe's blob limit), and ``data`` (uint8) or else ``float_data`` holding exactly
    ``channels × height × width`` values.

    Raises:
        DatumError: naming ``where`` (the database and the key) and what is wrong.
    """
    prefix = f"{where}: " if where else ""
    shape = (int(datum.channels), int(datum.height), int(datum.width))
    if _is_empty(datum):
        raise DatumError(f"{prefix}an empty Datum (no shape, no data, no float_data)")
    if min(shape) < 0 or shape[0] == 0:
        what = "a negative dimension" if min(shape) < 0 else "no channels"
        raise DatumError(
            f"{prefix}Datum {' × '.join(map(str, shape))} (channels × height × width) has {what}"
        )
    expected = 1
    for side in shape:  # Caffe's Blob::Reshape check, in its order
        if expected and side > INT32_MAX // expected:
            raise DatumError(
                f"{prefix}Datum {' × '.join(map(str, shape))} (channels × height × width) "
                "exceeds Caffe's blob size limit of 2^31-1 values"
            )
        expected *= side
    if expected == 0 and math.prod(side or 1 for side in shape) * 8 >= 1 << 63:
        # An empty blob Caffe takes, whose sides numpy cannot shape an array of floats with.
        raise DatumError(
            f"{prefix}Datum {' × '.join(map(str, shape))} (channels × height × width) holds "
            "no values and is too large a shape to read"
        )
    if len(datum.data) or datum.HasField("data"):
        if len(datum.data) != expected:
            raise DatumError(
                f"{prefix}Datum holds {len(datum.data)} data bytes, shape {shape} needs {expected}"
            )
    elif len(datum.float_data) != expected:
        raise DatumError(
            f"{prefix}Datum holds {len(datum.float_data)} float_data values, "
            f"shape {shape} needs {expected}"
        )
    return shape


def datum_to_array(datum: Any) -> np.ndarray:
    """The Datum's pixels as a fresh, writable ``(channels, height, width)`` array: uint8
    ``data``, or ``float_data`` as float64 (as pycaffe's ``caffe.io.datum_to_array``).

    Unlike pycaffe's, which reshapes an encoded Datum's PNG/JPEG bytes as if they were
    pixels, an encoded Datum (``encoded: true``) is decoded as Caffe's data layer decodes
    it: grey to 1 channel, colour to 3 in BGR order, the shape taken from the image.

    Raises:
        DatumError: the fields do not describe an image (:func:`check_datum`), or an
            encoded image cannot be decoded.
    """
    import numpy as np

    if datum.encoded:
        from mnist2db.formats.png_codec import decode_datum_image

        return decode_datum_image(datum.data, "encoded Datum")

    shape = datum_shape(datum)
    if len(datum.data) or datum.HasField("data"):
        # A writable copy, as pycaffe's caffe.io.datum_to_array returns.
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape).copy()
    return np.array(datum.float_data, dtype=float).reshape(shape)
