"""A raw record's pixels are copied straight into it (OpenCV's ``split`` where loaded, numpy's
strided copy where not): the same bytes as Caffe's ``CVMatToDatum`` order, channel after
channel, whatever the shape, the channels and the layout of the decoded image."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.formats.datum.message import datum_prefix
from mnist2db.formats.imread.cv2_wheel import NO_OPENCV, opencv
from mnist2db.formats.protowire import encode_varint
from mnist2db.imageset.decoding import raw_record


def expected(image: np.ndarray, label: int) -> bytes:
    """The record as a plain join of the channel-first pixels."""
    chw = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
    channels, height, width = chw.shape
    tail = b"\x28" + encode_varint(label) + b"\x38\x00"
    return datum_prefix(channels, height, width, chw.size) + chw.tobytes() + tail


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(1, 40),
    width=st.integers(1, 40),
    channels=st.sampled_from([0, 1, 3, 4]),
    label=st.integers(0, 2**31 - 1),
    strided=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    pure=st.booleans(),
)
def test_raw_record_is_the_channel_first_join(
    height: int, width: int, channels: int, label: int, strided: bool, seed: int, pure: bool
) -> None:
    rng = np.random.default_rng(seed)
    shape = (height, width * 2 if strided else width) + ((channels,) if channels else ())
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    if strided:  # every other column: not contiguous
        image = image[:, ::2]
    depth = channels or 1
    with pytest.MonkeyPatch.context() as patch:
        if pure:
            patch.setenv(NO_OPENCV, "1")
        else:
            opencv()  # loaded (where installed): the records use it once it is
        record = raw_record(image, (depth, height, width), b"\x28" + encode_varint(label))
    assert bytes(record) == expected(image, label)


def test_opencv_splits_in_place() -> None:
    """With the wheel the planes are written where the record holds them (the check that
    would copy them otherwise is not the path taken)."""
    cv2 = opencv()
    if cv2 is None:
        pytest.skip("opencv-python-headless is not installed")
    image = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    record = bytearray(5 * 7 * 3)
    planes = list(np.frombuffer(record, np.uint8).reshape(3, 5, 7))
    made = cv2.split(image, planes)
    assert [m.ctypes.data for m in made] == [p.ctypes.data for p in planes]
    assert bytes(record) == image.transpose(2, 0, 1).tobytes()
