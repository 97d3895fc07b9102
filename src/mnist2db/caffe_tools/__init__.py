"""Drop-ins for Caffe's data tools, with Caffe's arguments, gflags syntax and glog lines."""
