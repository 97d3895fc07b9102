"""OpenCV's own Python wheel (``opencv-python-headless``, a dependency where it has a wheel).

Caffe reads and resizes with OpenCV; its wheel's ``cv2.imdecode`` (libjpeg-turbo) and
``cv2.resize`` (``INTER_LINEAR`` in 11-bit fixed point) give Caffe's bytes ~4× and ~70× faster
than Pillow and numpy do here, so they are used where they are proved to give the same
bytes (JPEG decoding, the bilinear resize: see :mod:`mnist2db.formats.imread.reader` and
:mod:`mnist2db.formats.imread.resize`), and the pure path everywhere else and wherever the wheel is
absent. ``MNIST2DB_NO_OPENCV=1`` in the environment keeps to the pure path.

What differs between the wheels the project supports is a property of the loaded module,
found once a process: :func:`reads_cut_jpegs`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from types import ModuleType

#: The variable that keeps to the pure path (looked at on every call: a test or a bench sets
#: it in a running process).
NO_OPENCV = "MNIST2DB_NO_OPENCV"
_loaded: list[ModuleType | None] = []
_cut_jpegs_read: list[bool] = []


def _environment() -> tuple[dict[object, object] | None, object]:
    """The mapping behind ``os.environ`` and :data:`NO_OPENCV` as its key (encoded as
    ``os.environ`` encodes it: bytes on POSIX), or None where there is none to read (then
    ``os.environ`` itself is). Every change made through ``os.environ`` (a test's
    ``setenv``, ``del``) updates that mapping: a call costs one dict lookup, where
    ``os.environ.get`` of a variable not set costs ~1 µs (its KeyError), three or four times
    an image."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and callable(encode):
        return data, encode(NO_OPENCV)
    return None, NO_OPENCV  # pragma: no cover - not CPython's os.environ


_environ, _key = _environment()


def opencv() -> ModuleType | None:
    """The ``cv2`` module, set to run single-threaded (the pipeline runs one decoder per core),
    or None when it is not installed or ``MNIST2DB_NO_OPENCV`` is set."""
    if _environ.get(_key) if _environ is not None else os.environ.get(NO_OPENCV):
        return None
    if not _loaded:
        try:
            import cv2

            cv2.setNumThreads(1)
            _loaded.append(cv2)
        except ImportError:
            _loaded.append(None)
    return _loaded[0]


def reads_cut_jpegs(cv2: ModuleType) -> bool:
    """Whether the loaded OpenCV's ``imdecode`` returns an image for a JPEG cut inside its
    scan data (4.7, the declared floor, does: the rows it never reached as they were; newer
    ones refuse it): a small one made and cut here, once a process."""
    if not _cut_jpegs_read:
        import numpy as np

        noise = ((np.arange(48 * 48 * 3, dtype=np.uint64) * 2654435761) >> 13).astype(np.uint8)
        made, encoded = cv2.imencode(".jpg", noise.reshape(48, 48, 3))
        cut = np.asarray(encoded, dtype=np.uint8)[: len(encoded) * 2 // 3]
        _cut_jpegs_read.append(not made or cv2.imdecode(cut, cv2.IMREAD_COLOR) is not None)
    return _cut_jpegs_read[0]


def decoder_note() -> str:
    """The line a run's log gives on its decoders: OpenCV's wheel or the pure path, and why.
    It loads nothing: the workers load their decoders themselves, a list of plain PNGs never
    loads OpenCV, and ``import cv2`` costs ~0.1 s; the version of a wheel not loaded here is
    the one its ``cv2/version.py`` records (every opencv-python wheel has one)."""
    if _environ.get(_key) if _environ is not None else os.environ.get(NO_OPENCV):
        return f"decoding with Pillow and numpy ({NO_OPENCV}={os.environ.get(NO_OPENCV, '')})"
    if _loaded or "cv2" in sys.modules:
        cv2 = opencv()
        version = None if cv2 is None else str(cv2.__version__)
    else:
        spec = importlib.util.find_spec("cv2")
        if spec is None or spec.origin is None:
            version = None
        else:
            recorded = re.search(
                r'^opencv_version = "([0-9.]+)"',
                _text(os.path.join(os.path.dirname(spec.origin), "version.py")),
                re.MULTILINE,
            )
            version = recorded.group(1) if recorded else ""
    if version is None:
        return "decoding with Pillow and numpy (OpenCV not installed)"
    return f"decoding with OpenCV {version} (cv2)" if version else "decoding with OpenCV (cv2)"


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(4096)
    except (OSError, ValueError):
        return ""
