"""A database's records out of Caffe: IDX files (:mod:`.to_idx`), image files and a list
(:mod:`.image_files`), WebDataset shards (:mod:`.webdataset`), and what they share."""
