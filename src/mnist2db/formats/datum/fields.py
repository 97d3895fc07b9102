"""An encoded Datum's image bytes located in the serialized record, without protobuf.

``convert_imageset --encoded`` and ``convert --encoded png`` store ``data`` (the image
file's bytes), ``label`` and ``encoded: true`` (and perhaps the shape fields). An export
that writes those bytes as they are needs only where they lie: :func:`encoded_fields`
finds them in the record itself (a ``memoryview`` of LMDB's map is not copied), or says
None for any record it does not fully understand, which the caller then parses with
protobuf (and refuses, when it is no Datum, in protobuf's words).
"""

from __future__ import annotations

from typing import Any

#: The field tags a plain encoded Datum holds: channels, height, width (varints),
#: data (length-delimited), label, encoded (varints).
_VARINTS = {0x08: 0, 0x10: 1, 0x18: 2, 0x28: 4, 0x38: 5}
_DATA = 0x22
#: Varints of at most 5 bytes (values below 2^35, checked below 2^31): an int32 field of a
#: negative value takes 10 and goes to protobuf.
_VARINT_BYTES = 5
_INT32_LIMIT = 1 << 31


def encoded_fields(value: Any) -> tuple[int, int, int] | None:
    """``(start, end, label)``: ``value[start:end]`` is the ``data`` of the serialized Datum
    ``value`` (bytes or a buffer), which is ``encoded``; None when it is not encoded, or
    holds a field other than the shape, ``data``, ``label`` and ``encoded``, a field twice, a
    varint of more than 5 bytes or a value of 2^31 or more, or is cut short: protobuf
    then decides (and gives the same ``data`` and ``label`` for every record accepted here).
    """
    n = len(value)
    i = 0
    seen = 0
    start = end = -1
    label = 0
    encoded = 0
    while i < n:
        tag = value[i]
        i += 1
        field = _VARINTS.get(tag)
        if tag == _DATA:
            if seen & 8:
                return None
            seen |= 8
            length, i = _varint(value, i, n)
            if i < 0:
                return None
            start, end = i, i + length
            if end > n:
                return None
            i = end
            continue
        if field is None:
            return None
        bit = 1 << field
        if seen & bit:
            return None
        seen |= bit
        number, i = _varint(value, i, n)
        if i < 0:
            return None
        if field == 4:
            label = number
        elif field == 5:
            encoded = number
    if not encoded or start < 0:
        return None
    return start, end, label


def _varint(value: Any, i: int, n: int) -> tuple[int, int]:
    """The varint at ``value[i]`` and the index after it; ``(0, -1)`` when it is cut short,
    longer than :data:`_VARINT_BYTES` or not below 2^31."""
    if i >= n:
        return 0, -1
    byte = value[i]
    if byte < 0x80:
        return byte, i + 1
    number = byte & 0x7F
    shift = 7
    last = min(n, i + _VARINT_BYTES)
    i += 1
    while i < last:
        byte = value[i]
        number |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return (number, i) if number < _INT32_LIMIT else (0, -1)
        shift += 7
    return 0, -1
