"""Image bytes within OpenCV's limits: an input file checked before any decode, PNG records decoded."""
