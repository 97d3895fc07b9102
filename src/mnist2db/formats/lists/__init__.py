"""Text lists: Caffe's image lists, label tables, and the bounded line reader both use."""
