"""A photo set for the imageset benchmark: JPEGs cut from the real photographs scikit-image
ships in its wheel (random crops, sides 300-500 px, qualities 75-95) and a Caffe list file.

    python scripts/make_photos.py OUT_DIR [--count 2000] [--seed 0]

Writes ``OUT_DIR/images/NNNNNN.jpg`` and ``OUT_DIR/list.txt`` (``NNNNNN.jpg LABEL`` lines, the
label the photograph's index). Bench-only: needs ``pip install scikit-image``.
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina")  # fmt: skip


def make_photos(out: Path, count: int, seed: int = 0) -> Path:
    """Write ``count`` JPEGs under ``out/images`` and their list; returns the list's path."""
    import numpy as np
    from PIL import Image
    from skimage import data

    sources = [np.ascontiguousarray(getattr(data, name)()[:, :, :3]) for name in PHOTOS]
    rng = random.Random(seed)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        label = rng.randrange(len(sources))
        photo = sources[label]
        rows, cols = photo.shape[:2]
        h = min(rows, rng.randint(300, 500))
        w = min(cols, rng.randint(300, 500))
        top, left = rng.randint(0, rows - h), rng.randint(0, cols - w)
        crop = Image.fromarray(photo[top : top + h, left : left + w])
        buffer = io.BytesIO()
        crop.save(buffer, "JPEG", quality=rng.randint(75, 95))
        name = f"{i:06d}.jpg"
        (images / name).write_bytes(buffer.getvalue())
        lines.append(f"{name} {label}\n")
    listing = out / "list.txt"
    listing.write_text("".join(lines))
    return listing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_photos(args.out, args.count, args.seed))


if __name__ == "__main__":
    main()
