"""The benchmark's inputs, shared by scripts/bench.py and scripts/bench_read.py: Debian's
Fashion-MNIST gunzipped into a work directory, else generated records of the same shape."""

from __future__ import annotations

import gzip
import os
import random
import shutil
from pathlib import Path

FASHION = Path("/usr/share/datasets/fashion-mnist")


def gunzip_or_generate(work: Path) -> tuple[dict[str, tuple[Path, Path]], str]:
    data: dict[str, tuple[Path, Path]] = {}
    if all((FASHION / f"{n}.gz").exists() for n in _names("train") + _names("t10k")):
        for stem in ("train", "t10k"):
            paths = []
            for name in _names(stem):
                target = work / name
                with gzip.open(FASHION / f"{name}.gz") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                paths.append(target)
            data["train" if stem == "train" else "test"] = (paths[0], paths[1])
        return data, f"Debian's Fashion-MNIST ({FASHION}, gunzipped first)"
    data["train"] = generate(work, 60000, "train")
    data["test"] = generate(work, 10000, "test")
    return data, "generated 60 000 + 10 000 records (Fashion-MNIST not installed)"


def _names(stem: str) -> list[str]:
    return [f"{stem}-images-idx3-ubyte", f"{stem}-labels-idx1-ubyte"]


def generate(work: Path, count: int, stem: str) -> tuple[Path, Path]:
    """Random 28 × 28 images and 0-9 labels, written a chunk at a time."""
    images, labels = work / f"{stem}-images-idx3-ubyte", work / f"{stem}-labels-idx1-ubyte"
    rng = random.Random(count)
    with open(images, "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + count.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2)
        left = count
        while left:
            n = min(left, 10000)
            f.write(os.urandom(n * 784))
            left -= n
    with open(labels, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + count.to_bytes(4, "big"))
        f.write(bytes(rng.randrange(10) for _ in range(count)))
    return images, labels
