"""Your own images (imageset, convert_imageset): a list or class folders to Caffe records
(:mod:`.to_database`) or an MNIST IDX pair (:mod:`.to_idx`), decoded on worker processes
(:mod:`.workers`); the command itself is :mod:`.own_images`."""
