"""Caffe's message classes under protoc's module name, for code written against ``datum_pb2``.

Built at run time in mnist2db's private descriptor pool (see :func:`mnist2db.formats.datum.message.message_type`):
no generated code, so any protobuf from 3.20 to 7.x loads it, beside pycaffe's ``caffe_pb2``.
"""

from __future__ import annotations

from mnist2db.formats.datum.message import message_type

Datum = message_type("Datum")
BlobShape = message_type("BlobShape")
BlobProto = message_type("BlobProto")
