"""Make the recorded corpus of the export round trips: an image tree, its list, and the
digests of what Caffe's own convert_imageset writes from it, and from our export of that.

    python make_corpus.py images                       # (re)write images/ and list.txt
    python make_corpus.py digests CONVERT_IMAGESET     # run Caffe's tool; write digests.json

The tree has nested folders, a name with a space, one image listed twice (two labels),
JPEG, PNG (grey and colour) and BMP files, and one unreadable file, which convert_imageset
skips (a gap in its keys' numbers). For each run (flags) and backend, digests.json holds
every key and the SHA-256 of its value: ``made``, from images/ and list.txt; ``again``,
from ``mnist2db export --to files`` of ``made``'s database, converted back by Caffe's tool
with ``again_flags`` (``--encoded`` for encoded records; raw records are exported as PNG
and read back with Caffe's colour or ``--gray`` reading).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(HERE, "images")
LIST = os.path.join(HERE, "list.txt")

#: name -> (flags of the first conversion, flags converting the export back).
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "encoded": (["--encoded"], ["--encoded"]),
    "encoded-gray": (["--encoded", "--gray"], ["--encoded", "--gray"]),
    "encode-png": (["--encoded", "--encode_type=png"], ["--encoded"]),
    "raw-colour": ([], []),
    "raw-gray": (["--gray"], ["--gray"]),
}
BACKENDS = ("lmdb", "leveldb")
#: (path, label) in list order; "broken.jpg" is not an image.
ENTRIES = [
    ("cat/tabby.jpg", 0),
    ("cat/grey.png", 0),
    ("broken.jpg", 1),
    ("dog/puppy/small.png", 1),
    ("dog/big dog.jpg", 1),
    ("bird.bmp", 2),
    ("cat/tabby.jpg", 3),
    ("mixed/UPPER.PNG", 2),
]


def _scene(seed: int, height: int, width: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = [
        127
        + 100 * np.sin(rng.uniform(0.05, 0.4) * x + rng.uniform(0.05, 0.4) * y)
        + rng.normal(0, 18, (height, width))
        for _ in range(channels)
    ]
    return np.clip(np.stack(planes, axis=2), 0, 255).astype(np.uint8)


def make_images() -> None:
    shutil.rmtree(IMAGES, ignore_errors=True)
    for folder in ("cat", "dog/puppy", "mixed"):
        os.makedirs(os.path.join(IMAGES, folder))
    Image.fromarray(_scene(1, 21, 29, 3)).save(os.path.join(IMAGES, "cat/tabby.jpg"), quality=90)
    Image.fromarray(_scene(2, 17, 13, 1)[:, :, 0]).save(os.path.join(IMAGES, "cat/grey.png"))
    Image.fromarray(_scene(3, 9, 11, 3)).save(os.path.join(IMAGES, "dog/puppy/small.png"))
    Image.fromarray(_scene(4, 25, 19, 3)).save(os.path.join(IMAGES, "dog/big dog.jpg"))
    Image.fromarray(_scene(5, 14, 15, 3)).save(os.path.join(IMAGES, "bird.bmp"))
    Image.fromarray(_scene(6, 12, 10, 3)).save(os.path.join(IMAGES, "mixed/UPPER.PNG"), "PNG")
    with open(os.path.join(IMAGES, "broken.jpg"), "wb") as out:
        out.write(b"not an image\n")
    with open(LIST, "w", encoding="utf-8") as out:
        out.writelines(f"{path} {label}\n" for path, label in ENTRIES)


def read_db(path: str, backend: str) -> dict[str, str]:
    """Every key of a database and the SHA-256 of its value."""
    if backend == "lmdb":
        import lmdb

        env = lmdb.open(path, readonly=True, lock=False)
        with env.begin() as txn:
            found = {k.decode(): hashlib.sha256(v).hexdigest() for k, v in txn.cursor()}
        env.close()
        return found
    import plyvel

    db = plyvel.DB(path)
    found = {k.decode(): hashlib.sha256(v).hexdigest() for k, v in db}
    db.close()
    return found


def make_digests(tool: str) -> None:
    runs: dict[str, object] = {}
    work = tempfile.mkdtemp()
    try:
        for name, (flags, again_flags) in RUNS.items():
            run: dict[str, object] = {"flags": flags, "again_flags": again_flags}
            for backend in BACKENDS:
                made = os.path.join(work, f"{name}-{backend}")
                subprocess.run([tool, *flags, f"--backend={backend}", IMAGES + "/", LIST, made],
                               check=True, capture_output=True)  # fmt: skip
                out = os.path.join(work, f"{name}-{backend}-files")
                subprocess.run([sys.executable, "-m", "mnist2db", "export", "--to", "files",
                                "--quiet", made, out], check=True)  # fmt: skip
                again = os.path.join(work, f"{name}-{backend}-again")
                subprocess.run([tool, *again_flags, f"--backend={backend}", out + "/",
                                os.path.join(out, "list.txt"), again],
                               check=True, capture_output=True)  # fmt: skip
                run[backend] = {"made": read_db(made, backend), "again": read_db(again, backend)}
            runs[name] = run
    finally:
        shutil.rmtree(work)
    with open(os.path.join(HERE, "digests.json"), "w", encoding="utf-8") as out:
        json.dump({"tool": "Caffe convert_imageset", "runs": runs}, out, indent=1, sort_keys=True)
        out.write("\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["images"]:
        make_images()
    elif sys.argv[1:2] == ["digests"] and len(sys.argv) == 3:
        make_digests(sys.argv[2])
    else:
        sys.exit(__doc__)
