"""Make the recorded corpus of the convert_imageset tests: small images, list files, and the
digests of what Caffe's own convert_imageset writes from them.

    python make_corpus.py images                 # (re)write images/ and the list files
    python make_corpus.py digests CONVERT_IMAGESET   # run Caffe's tool; write digests.json
    python make_corpus.py resize OPENCV_PROBE    # OpenCV's resize on random sizes: resize.json

The images are generated from fixed seeds (smooth gradients with noise, so that JPEG and
resizing have something to do), in every format and pixel layout whose decoding is
promised identical to Caffe's: PNG (8-bit grey, grey+alpha, RGB, RGBA, palettes with and
without transparency, 1/2/4-bit grey, 16-bit grey, RGB and RGBA), BMP (24-bit, 32-bit,
grey and colour palettes), PPM/PGM (8 and 16 bits), TIFF (grey, RGB, RGBA, LZW), JPEG
(4:4:4, 4:2:2, 4:2:0, grey, progressive, CMYK, all eight EXIF orientations, four missing
their final EOI marker) and WebP (lossy, lossless, alpha). ``digests.json`` holds, per run (flags and list), per backend,
each record's key and the SHA-256 of its value, read back from the database Caffe wrote.
The images are committed as made: a different Pillow or libjpeg may write other bytes,
so remaking the images means remaking the digests with Caffe too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(HERE, "images")

#: The runs recorded: name -> (list file, flags). Shuffle is left out: Caffe's is unseeded.
RUNS: dict[str, tuple[str, list[str]]] = {
    "colour": ("all.txt", []),
    "gray": ("all.txt", ["--gray"]),
    "resize": ("all.txt", ["--resize_width=13", "--resize_height=9"]),
    "resize-up": ("all.txt", ["--resize_width=40", "--resize_height=31"]),
    "gray-resize": ("all.txt", ["--gray", "--resize_width=13", "--resize_height=9"]),
    "encoded": ("all.txt", ["--encoded"]),
    "encoded-gray": ("all.txt", ["--encoded", "--gray"]),
    "encoded-resize": ("encodable.txt", ["--encoded", "--resize_width=13", "--resize_height=9"]),
    "png": ("all.txt", ["--encoded", "--encode_type=png"]),
    "png-gray": ("all.txt", ["--encoded", "--encode_type=png", "--gray"]),
    "png-resize": ("all.txt", ["--encode_type=png", "--resize_width=13", "--resize_height=9"]),
    "jpg": ("all.txt", ["--encoded", "--encode_type=jpg"]),
    "jpg-gray": ("all.txt", ["--encoded", "--encode_type=jpg", "--gray"]),
    "jpg-resize": ("all.txt", ["--encode_type=jpg", "--resize_width=13", "--resize_height=9"]),
    "check-size": ("same.txt", ["--check_size"]),
    "check-size-gray": ("same.txt", ["--check_size", "--gray"]),
}
BACKENDS = ("lmdb", "leveldb")
#: JPEGs written again without their EOI marker (FF D9: 2 bytes short) or its second byte
#: (1 byte short): (name, the JPEG it is cut from, its length as a slice's end).
NO_EOI = (
    ("no_eoi_420.jpg", "jpeg_420.jpg", -2),
    ("no_eoi_progressive.jpeg", "jpeg_progressive.jpeg", -2),
    ("no_eoi_grey.jpg", "jpeg_grey.jpg", -2),
    ("no_eoi_but_ff_444.jpg", "jpeg_444.jpg", -1),
)


def _scene(seed: int, height: int, width: int, channels: int) -> np.ndarray:
    """Smooth colour gradients plus noise, uint8 (height, width, channels)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for _ in range(channels):
        a, b, phase = rng.uniform(0.05, 0.4, 2).tolist() + [rng.uniform(0, 6.3)]
        wave = 127 + 100 * np.sin(a * x + b * y + phase)
        planes.append(wave + rng.normal(0, 18, (height, width)))
    return np.clip(np.stack(planes, axis=2), 0, 255).astype(np.uint8)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _raw_png(rows: list[bytes], width: int, height: int, depth: int, colour: int) -> bytes:
    """A PNG from packed scanlines, filter 0, for layouts Pillow does not write."""
    data = b"".join(b"\x00" + row for row in rows)
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(data, 9))
        + _chunk(b"IEND", b"")
    )


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def make_images() -> dict[str, tuple[int, int]]:
    """Write every image; returns name -> (width, height)."""
    shutil.rmtree(IMAGES, ignore_errors=True)
    os.makedirs(IMAGES)
    made: dict[str, tuple[int, int]] = {}

    def save(name: str, picture: Image.Image, **options: object) -> None:
        picture.save(os.path.join(IMAGES, name), **options)
        made[name] = picture.size

    def write(name: str, data: bytes, size: tuple[int, int]) -> None:
        with open(os.path.join(IMAGES, name), "wb") as out:
            out.write(data)
        made[name] = size

    rgb = Image.fromarray(_scene(1, 23, 31, 3))
    grey = Image.fromarray(_scene(2, 23, 31, 1)[:, :, 0])
    alpha = Image.fromarray(_scene(3, 23, 31, 1)[:, :, 0])
    rgba = rgb.copy()
    rgba.putalpha(alpha)
    # PNG
    save("png_grey.png", grey)
    save("png_rgb.png", rgb)
    save("png_rgba.png", rgba)
    save("png_grey_alpha.png", Image.merge("LA", (grey, alpha)))
    palette = rgb.quantize(16)
    save("png_palette.png", palette)
    save("png_palette_trns.png", palette, transparency=3)
    save("png_grey_trns.png", grey, transparency=40)
    save("png_bilevel.png", grey.point(lambda v: 255 * (v > 127)).convert("1"))
    save("png_exif6.png", rgb, exif=_exif(6))
    levels = _scene(4, 17, 21, 1)[:, :, 0]
    for depth in (2, 4):
        packed = (levels >> (8 - depth)).astype(np.uint8)
        per = 8 // depth
        padded = np.zeros((17, -(-21 // per) * per), dtype=np.uint8)
        padded[:, :21] = packed
        groups = padded.reshape(17, -1, per)
        rows = [
            bytes(int(sum(int(v) << (8 - depth * (i + 1)) for i, v in enumerate(g))) for g in r)
            for r in groups
        ]
        write(f"png_grey{depth}bit.png", _raw_png(rows, 21, 17, depth, 0), (21, 17))
    wide = _scene(5, 19, 27, 4).astype(np.uint16) * 257 + np.random.default_rng(6).integers(
        0, 256, (19, 27, 4), dtype=np.uint16
    )
    write(
        "png_grey16.png",
        _raw_png([r.astype(">u2").tobytes() for r in wide[:, :, 0]], 27, 19, 16, 0),
        (27, 19),
    )
    write(
        "png_rgb16.png",
        _raw_png([r.astype(">u2").tobytes() for r in wide[:, :, :3]], 27, 19, 16, 2),
        (27, 19),
    )
    write(
        "png_rgba16.png",
        _raw_png([r.astype(">u2").tobytes() for r in wide], 27, 19, 16, 6),
        (27, 19),
    )
    with open(os.path.join(IMAGES, "png_rgb.png"), "rb") as stream:
        plain = stream.read()
    for name, chunk in (
        ("png_gamma.png", _chunk(b"gAMA", struct.pack(">I", 45455))),
        ("png_srgb.png", _chunk(b"sRGB", b"\x00")),
    ):
        write(name, plain[:33] + chunk + plain[33:], rgb.size)  # after IHDR
    # BMP
    save("bmp_1bit.bmp", grey.convert("1"))
    save("bmp_4bit.bmp", rgb.quantize(16), bits=4)
    save("bmp_rgb.bmp", rgb)
    save("bmp_rgba.bmp", rgba)
    save("bmp_grey.bmp", grey)
    save("bmp_palette.bmp", palette)
    # PPM / PGM
    save("ppm_rgb.ppm", rgb)
    save("pgm_grey.pgm", grey)
    save("pbm_bilevel.pbm", grey.convert("1"))
    shallow = (np.asarray(grey).astype(np.int64) * 100 // 255).astype(np.uint8)
    write(
        "pgm_maxval100.pgm",
        b"P5\n# made by make_corpus.py\n31 23\n100\n" + shallow.tobytes(),
        (31, 23),
    )
    save("pgm_grey16.pgm", Image.fromarray(wide[:, :, 1].astype(np.uint16)).convert("I"))
    # TIFF
    save("tiff_rgb.tif", rgb)
    save("tiff_grey.tiff", grey)
    save("tiff_rgba.tif", rgba)
    save("tiff_lzw.tif", rgb, compression="tiff_lzw")
    save("tiff_cmyk.tif", rgb.convert("CMYK"))
    save("tiff_palette.tif", palette)
    # JPEG
    photo = Image.fromarray(_scene(7, 29, 37, 3))
    save("jpeg_444.jpg", photo, quality=90, subsampling=0)
    save("jpeg_422.jpg", photo, quality=90, subsampling=1)
    save("jpeg_420.jpg", photo, quality=90, subsampling=2)
    save("jpeg_grey.jpg", Image.fromarray(_scene(8, 29, 37, 1)[:, :, 0]), quality=90)
    save("jpeg_progressive.jpeg", photo, quality=85, progressive=True)
    save("JPEG_UPPER.JPG", photo, quality=80)
    save("jpeg_cmyk.jpg", photo.convert("CMYK"), quality=90)
    for orientation in range(1, 9):
        save(f"jpeg_exif{orientation}.jpg", photo, quality=90, exif=_exif(orientation))
    # Missing their final EOI marker and only it (their scans whole), or its second byte:
    # Caffe's libjpeg reads each as the whole file. Listed after the rest (their keys last).
    for name, source_name, cut in NO_EOI:
        with open(os.path.join(IMAGES, source_name), "rb") as source:
            whole = source.read()
        write(name, whole[:cut], made[source_name])
    # WebP
    save("webp_lossy.webp", photo, quality=80)
    save("webp_lossless.webp", rgb, lossless=True)
    save("webp_alpha.webp", rgba, lossless=True)
    # Not images, or not there: Caffe skips them and leaves a gap in the keys.
    write("broken.png", b"\x89PNG\r\n\x1a\nthis is not a PNG", (0, 0))
    # Same-size images for --check_size.
    for i in range(3):
        save(f"same_{i}.png", Image.fromarray(_scene(20 + i, 11, 14, 3)))
    save("same with space.png", Image.fromarray(_scene(30, 11, 14, 3)))
    return made


def write_lists(made: dict[str, tuple[int, int]]) -> None:
    names = sorted(n for n in made if not n.startswith(("same", "no_eoi")))
    lines = [f"{name} {i % 10}" for i, name in enumerate(names)]
    lines.insert(5, "missing.png 3")  # skipped by Caffe: the keys have a gap
    lines.append("png_rgb.png -1")  # the same file twice, a negative label
    lines += [f"{name} {i}" for i, (name, _, _) in enumerate(NO_EOI)]
    with open(os.path.join(HERE, "all.txt"), "w") as out:
        out.write("\n".join(lines) + "\n")
    encodable = [
        line
        for line in lines
        if line.split(" ")[0].lower().endswith((".png", ".jpg", ".jpeg", ".bmp"))
    ]
    with open(os.path.join(HERE, "encodable.txt"), "w") as out:
        out.write("\n".join(encodable) + "\n")
    same = sorted(n for n in made if n.startswith("same"))
    with open(os.path.join(HERE, "same.txt"), "w") as out:
        out.write("".join(f"{name} {i}\n" for i, name in enumerate(same)))


def read_db(path: str, backend: str) -> dict[str, str]:
    """Every key of a database and the SHA-256 of its value: what digests.json records (the
    test reads our output the same way)."""
    records: dict[str, str] = {}
    if backend == "lmdb":
        import lmdb

        with lmdb.open(path, readonly=True, lock=False) as env, env.begin() as txn:
            for key, value in txn.cursor():
                records[key.decode()] = hashlib.sha256(value).hexdigest()
    else:
        import plyvel

        db = plyvel.DB(path)
        try:
            for key, value in db:
                records[key.decode()] = hashlib.sha256(value).hexdigest()
        finally:
            db.close()
    return records


def make_digests(tool: str) -> None:
    out: dict[str, object] = {
        "tool": "Caffe 9b89154 tools/convert_imageset, OpenCV 4.6 (Debian 12)",
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name, (listing, flags) in RUNS.items():
            run: dict[str, object] = {"list": listing, "flags": flags}
            for backend in BACKENDS:
                db = os.path.join(scratch, f"{name}-{backend}")
                subprocess.run(
                    [
                        tool,
                        *flags,
                        f"--backend={backend}",
                        IMAGES + "/",
                        os.path.join(HERE, listing),
                        db,
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                run[backend] = read_db(db, backend)
            out["runs"][name] = run  # type: ignore[index]
            print(name, len(run["lmdb"]), "records", file=sys.stderr)  # type: ignore[arg-type]
    with open(os.path.join(HERE, "digests.json"), "w") as stream:
        json.dump(out, stream, indent=1, sort_keys=True)
        stream.write("\n")


def make_resize_cases(probe: str, count: int = 300) -> None:
    """OpenCV's ``cv::resize`` (INTER_LINEAR) of random images to random sizes, through
    opencv_probe.cpp (imread of a PNG, resize, raw pixels out): per case the seed, the
    shapes and the SHA-256 of OpenCV's pixels."""
    rng = np.random.default_rng(2026)
    cases = []
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "in.png")
        for i in range(count):
            h, w = (int(v) for v in rng.integers(1, 120, 2))
            c = int(rng.choice([1, 3]))
            nh, nw = (int(v) for v in rng.integers(1, 160, 2))
            if i % 10 == 0:
                nh, nw = max(1, h // 2), max(1, w // 2)
            pixels = np.random.default_rng(i).integers(0, 256, (h, w, c), dtype=np.uint8)
            Image.fromarray(pixels[:, :, 0] if c == 1 else pixels[:, :, ::-1]).save(source)
            flag = "0" if c == 1 else "1"
            raw = subprocess.run([probe, source, flag, str(nw), str(nh)], check=True,
                                 capture_output=True).stdout.split(b"\n", 1)[1]  # fmt: skip
            cases.append({"seed": i, "shape": [h, w, c], "size": [nw, nh],
                          "sha256": hashlib.sha256(raw).hexdigest()})  # fmt: skip
    with open(os.path.join(HERE, "resize.json"), "w") as stream:
        json.dump({"tool": "cv::resize, OpenCV 4.6 (Debian 12)", "cases": cases}, stream, indent=0)
        stream.write("\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["images"]:
        write_lists(make_images())
    elif sys.argv[1:2] == ["digests"] and len(sys.argv) == 3:
        make_digests(sys.argv[2])
    elif sys.argv[1:2] == ["resize"] and len(sys.argv) == 3:
        make_resize_cases(sys.argv[2])
    else:
        sys.exit(__doc__)
