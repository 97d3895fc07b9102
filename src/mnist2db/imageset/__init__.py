"""Your own images: Caffe's convert_imageset records (:mod:`.imageset`), decoded on a few threads
(:mod:`.decoding`), and class-folder trees to databases or IDX (:mod:`.own_images`)."""
