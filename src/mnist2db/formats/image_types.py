"""The type a record's image is encoded as, as ``convert_imageset`` decides it: the types
written as Caffe writes them (:data:`ENCODE_TYPES`, :mod:`mnist2db.formats.image_encode`),
the type of an entry (:func:`encoding_of`) and whether a file's own bytes are already of
it (:func:`matches_ext`, Caffe's ``matchExt``). No numpy: the list's check uses them
before any image is decoded.
"""

from __future__ import annotations

import os

from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    from mnist2db.formats.image_list import ListEntry

#: The types written as Caffe writes them (``cv::imencode``'s extensions).
ENCODE_TYPES = ("png", "jpg", "jpeg", "jpe", "bmp", "dib")


def encoding_of(entry: ListEntry, encode_type: str | None) -> str:
    """The type ``entry``'s record is encoded as: ``encode_type``, or Caffe's guess, the
    path's extension in lower case."""
    if encode_type:
        return encode_type.lower()
    path = entry.path
    dot = path.rfind(b".")
    return os.fsdecode(path[dot + 1 :] if dot >= 0 else path).lower()


def matches_ext(filename: bytes, encoding: str) -> bool:
    """Caffe's ``matchExt``: the file's extension (after its last dot) is the encoding."""
    dot = filename.rfind(b".")
    ext = os.fsdecode(filename[dot + 1 :] if dot >= 0 else filename).lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")
