"""The file formats: IDX (the format, its reader, pipes) and Caffe's Datum (raw and PNG-encoded)."""
