"""formats.datum_fields: an encoded Datum's image bytes found without protobuf, always as
protobuf reads them, or left to protobuf."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.datum_pb2 import Datum
from mnist2db.formats.datum.fields import encoded_fields
from mnist2db.formats.protowire import encode_varint

#: Fields as a record may hold them: the plain ones, and the ones that send it to protobuf
#: (float_data, an unknown field, a negative label's 10-byte varint, bytes cut short).
_FIELD = st.one_of(
    st.tuples(st.sampled_from([0x08, 0x10, 0x18, 0x28, 0x38]), st.integers(0, 1 << 33)).map(
        lambda f: bytes([f[0]]) + encode_varint(f[1])
    ),
    st.binary(max_size=40).map(lambda b: b"\x22" + encode_varint(len(b)) + b),
    st.just(b"\x28" + encode_varint((1 << 64) - 5)),  # label -5
    st.just(b"\x35\x00\x00\x80\x3f"),  # float_data 1.0
    st.just(b"\x42\x01x"),  # field 8: unknown
    st.binary(max_size=3),
)


def _protobuf(value: bytes) -> Datum | None:
    datum = Datum()
    try:
        datum.ParseFromString(value)
    except Exception:
        return None
    return datum


@settings(max_examples=2000, deadline=None)
@given(st.lists(_FIELD, max_size=8))
def test_encoded_fields_agree_with_protobuf(fields: list[bytes]) -> None:
    value = b"".join(fields)
    found = encoded_fields(value)
    if found is None:
        return
    datum = _protobuf(value)
    assert datum is not None and datum.encoded
    start, end, label = found
    assert (value[start:end], label) == (datum.data, datum.label)
    assert encoded_fields(memoryview(value)) == found


def test_encoded_fields_of_the_records_encoders_write() -> None:
    data = b"\xff\xd8\xff" + bytes(range(256)) * 300
    caffe = Datum(data=data, label=7, encoded=True).SerializeToString()  # convert_imageset
    found = encoded_fields(caffe)
    assert found is not None and caffe[found[0] : found[1]] == data and found[2] == 7
    shaped = Datum(channels=3, height=40, width=30, data=data, label=0, encoded=True)
    value = shaped.SerializeToString()
    found = encoded_fields(value)
    assert found is not None and value[found[0] : found[1]] == data and found[2] == 0
    raw = Datum(channels=1, height=2, width=2, data=b"abcd", label=1).SerializeToString()
    assert encoded_fields(raw) is None  # raw pixels: not encoded
    assert encoded_fields(caffe[:-3]) is None  # cut short
    assert encoded_fields(caffe + b"\x38\x01") is None  # a field twice: protobuf decides
    negative = Datum(data=data, label=-1, encoded=True).SerializeToString()
    assert encoded_fields(negative) is None
