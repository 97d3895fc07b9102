"""Protocol Buffers' wire format, the little of it that Caffe's messages need written by hand.

The Datum and BlobProto encoders (:mod:`mnist2db.formats.datum.message`, :mod:`mnist2db.formats.png.encoder`,
:mod:`mnist2db.mean`) write fixed layouts directly instead of building messages: a varint is
the one piece they share.
"""

from __future__ import annotations


def encode_varint(value: int) -> bytes:
    """Encode an int32/int64 field value as protobuf does (negatives take 10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
