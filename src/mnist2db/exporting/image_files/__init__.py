"""export --to files: one image file per record and Caffe's list file, in a staged tree."""
