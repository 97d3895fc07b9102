"""OpenCV's own Python wheel (``opencv-python-headless``, the ``opencv`` extra), where installed.

Caffe reads and resizes with OpenCV; its wheel's ``cv2.imdecode`` (libjpeg-turbo) and
``cv2.resize`` (``INTER_LINEAR`` in 11-bit fixed point) give Caffe's bytes ~4× and ~70× faster
than Pillow and numpy do here, so they are used where they are proved to give the same
bytes (JPEG decoding, the bilinear resize: see :mod:`mnist2db.formats.image` and
:mod:`mnist2db.formats.resize`), and the pure path everywhere else and wherever the wheel is
absent. ``MNIST2DB_NO_OPENCV=1`` in the environment keeps to the pure path.
"""

from __future__ import annotations

import os
from types import ModuleType

#: The variable that keeps to the pure path (read at every call: a test or a bench sets it).
NO_OPENCV = "MNIST2DB_NO_OPENCV"
_loaded: list[ModuleType | None] = []


def opencv() -> ModuleType | None:
    """The ``cv2`` module, set to run single-threaded (the pipeline runs one decoder per core),
    or None when it is not installed or ``MNIST2DB_NO_OPENCV`` is set."""
    if os.environ.get(NO_OPENCV):
        return None
    if not _loaded:
        try:
            import cv2

            cv2.setNumThreads(1)
            _loaded.append(cv2)
        except ImportError:
            _loaded.append(None)
    return _loaded[0]
