"""Image files read, resized and written as Caffe's OpenCV does (imread, resize, imencode)."""
