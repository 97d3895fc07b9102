"""A database's records out of Caffe: image files and a list (``export --to files``), WebDataset shards."""
