"""Caffe's Datum: the fixed-layout encoder and keys, fields found without protobuf, float label records."""
