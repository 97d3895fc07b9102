"""OpenCV's ``cv::resize(src, dst, Size(w, h))`` (``INTER_LINEAR``) on uint8 images, in numpy.

Caffe's ``convert_imageset --resize_width/--resize_height`` resizes with OpenCV's default,
bilinear interpolation in 11-bit fixed point, which neither Pillow's bilinear filter nor
OpenCV's own ``INTER_LINEAR_EXACT`` reproduces. The steps, as OpenCV 4 runs them on x86-64:

* a size equal to the source's is a copy; exactly half the size in both directions is
  OpenCV's fast ``INTER_AREA``: each pixel the rounded mean of a 2×2 block;
* otherwise each destination column ``dx`` samples source column
  ``fx = float32((dx + 0.5) * scale - 0.5)``, ``sx = floor(fx)``, clamped to the edges
  (weight 0 beyond them), with weights ``round(2048 * (1 - (fx - sx)))`` and
  ``round(2048 * (fx - sx))`` (round half to even); rows likewise, except that a row
  beyond an edge keeps its fractional weights, both on the edge row;
* a horizontal pass in exact integers (``S[sx] * a0 + S[sx + 1] * a1``), then a vertical
  pass that combines two rows with weights ``b0, b1`` as OpenCV's vector code does, in
  16-bit lanes: ``(((b0 * (s0 >> 4)) >> 16) + ((b1 * (s1 >> 4)) >> 16) + 2) >> 2``. This
  differs now and then by one from the exact ``(b0 * s0 + b1 * s1 + 2**21) >> 22`` of
  OpenCV's scalar code, which Caffe's builds do not reach for 8-bit images (checked
  against OpenCV 4.6 on random sizes up to 260 × 260, grey and colour).

:func:`resize_linear` is ``cv2.resize`` itself where OpenCV's wheel is installed
(:mod:`mnist2db.formats.imread.cv2_wheel`; 0.13 ms for a 400 × 500 photo to 256 × 256 here, the same
bytes, proved against :func:`resize_numpy` by the tests), else :func:`resize_numpy`: the
steps above in int32, the horizontal pass over only the source rows the vertical pass
reads (~2 ms for that photo).
"""

from __future__ import annotations

import numpy as np

from mnist2db.formats.imread.cv2_wheel import opencv

_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS


def _taps(source: int, target: int, *, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per destination index: the first source index, the second, and the two weights.

    ``clamp``: columns beyond an edge take the edge column with weight 1 (OpenCV's
    horizontal taps); rows keep their fractional weights over the edge row twice (its
    vertical taps, whose two weights are then rounded apart).
    """
    scale = source / target
    f = ((np.arange(target, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    frac = (f - s.astype(np.float32)).astype(np.float32)
    if clamp:
        low = s < 0
        high = s >= source - 1
        frac[low | high] = 0
        s[low] = 0
        s[high] = source - 1
    w0 = np.rint(((np.float32(1) - frac) * np.float32(_COEF_SCALE)).astype(np.float32))
    w1 = np.rint((frac * np.float32(_COEF_SCALE)).astype(np.float32))
    first = np.clip(s, 0, source - 1)
    second = np.clip(s + 1, 0, source - 1)
    return first, second, np.stack([w0, w1]).astype(np.int64)


def resize_linear(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` (``(h, w)`` or ``(h, w, c)`` uint8) resized to ``width × height`` exactly as
    OpenCV's ``cv::resize`` with ``INTER_LINEAR`` does it. A new array of the same layout:
    by OpenCV's wheel where installed, else :func:`resize_numpy`.

    Raises:
        ValueError: a size below 1.
    """
    if width < 1 or height < 1:
        raise ValueError(f"cannot resize to {width} × {height}")
    cv2 = opencv()
    if cv2 is None or image.dtype.name != "uint8" or image.ndim == 3 and image.shape[2] > 4:
        return resize_numpy(image, width, height)
    out: np.ndarray = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    return out.reshape((height, width) + image.shape[2:])


def resize_numpy(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """:func:`resize_linear` in numpy alone (OpenCV's steps, in the module docstring).

    Raises:
        ValueError: a size below 1.
    """
    if width < 1 or height < 1:
        raise ValueError(f"cannot resize to {width} × {height}")
    rows, cols = image.shape[:2]
    if (rows, cols) == (height, width):
        return image.copy()
    grey = image.ndim == 2
    pixels = image[:, :, None] if grey else image
    channels = pixels.shape[2]
    if cols == 2 * width and rows == 2 * height:
        blocks = pixels.astype(np.uint16).reshape(height, 2, width, 2, channels)
        half: np.ndarray = ((blocks.sum(axis=(1, 3)) + 2) >> 2).astype(np.uint8)
        return half[:, :, 0] if grey else half
    x0, x1, xw = _taps(cols, width, clamp=True)
    y0, y1, yw = _taps(rows, height, clamp=False)
    # Horizontal pass over the rows the vertical pass reads only; int32 holds every value
    # (at most 255 * 2048, and 2048 * (255 * 2048 >> 4) in the vertical pass).
    needed, where = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    source = pixels[needed]
    a0 = xw[0].astype(np.int32)[None, :, None]
    a1 = xw[1].astype(np.int32)[None, :, None]
    across = source[:, x0, :].astype(np.int32)
    across *= a0
    right = source[:, x1, :].astype(np.int32)
    right *= a1
    across += right
    across >>= 4
    v0 = across[where[:height]].reshape(height, width * channels)
    v1 = across[where[height:]].reshape(height, width * channels)
    v0 *= yw[0].astype(np.int32)[:, None]
    v0 >>= 16
    v1 *= yw[1].astype(np.int32)[:, None]
    v1 >>= 16
    v0 += v1
    v0 += 2
    v0 >>= 2
    result: np.ndarray = np.clip(v0, 0, 255).astype(np.uint8).reshape(height, width, channels)
    return result[:, :, 0] if grey else result
