"""NVIDIA DALI as a client: ``fn.readers.caffe`` reads mnist2db's LMDBs, on the CPU.

Raw Datums (what Caffe's convert_mnist_data writes) carry no ``encoded`` field, so DALI hands
out each record's pixel bytes flat (rows x cols uint8) and its label; PNG Datums
(``--encoded png``) decode with ``fn.decoders.image(..., output_type=types.GRAY)`` to
``(rows, cols, 1)``. Every record DALI returns is compared with the source.

Skipped where DALI is not installed; ``make test-dali`` (run by CI) installs it in its own
environment (nvidia-dali-cuda120, CPU only: ``device_id=None``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import fashion_file

import mnist2db

dali = pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (make test-dali)")

Pair = Callable[..., tuple[Path, Path, np.ndarray, np.ndarray]]


def dali_records(db: Path, decode_png: bool, batch_size: int = 500) -> tuple[list, list]:
    """Every record of ``db`` as DALI's CPU pipeline gives it, in key order: (images, labels)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipeline():  # type: ignore[no-untyped-def]
        data, label = fn.readers.caffe(
            path=str(db), random_shuffle=False, pad_last_batch=True, name="reader"
        )
        if decode_png:
            data = fn.decoders.image(data, device="cpu", output_type=types.GRAY)
        return data, label

    pipe = pipeline()
    pipe.build()
    total = pipe.epoch_size("reader")
    images: list[np.ndarray] = []
    labels: list[int] = []
    while len(images) < total:
        data, label = pipe.run()
        for i in range(len(data)):
            images.append(np.array(data.at(i)))
            labels.append(int(np.array(label.at(i)).reshape(-1)[0]))
    del pipe
    return images[:total], labels[:total]


def check(db: Path, images: np.ndarray, labels: np.ndarray, decode_png: bool) -> None:
    found_images, found_labels = dali_records(db, decode_png)
    assert len(found_images) == len(images)
    assert found_labels == labels.tolist()
    rows, cols = images.shape[1:]
    for index, (found, image) in enumerate(zip(found_images, images, strict=True)):
        if decode_png:
            assert found.shape == (rows, cols, 1) and found.dtype == np.uint8, index
            assert np.array_equal(found[:, :, 0], image), index
        else:
            # No `encoded` field: the Datum's data bytes, flat; reshape with rows and cols.
            assert found.shape == (rows * cols,) and found.dtype == np.uint8, index
            assert found.tobytes() == image.tobytes(), index


@pytest.mark.parametrize("encoded", [None, "png"])
def test_dali_reads_every_record_of_a_small_database(
    tmp_path: Path, mnist_pair: Pair, encoded: str | None
) -> None:
    images_path, labels_path, images, labels = mnist_pair(1234, rows=5, cols=7)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, encoded=encoded)
    check(db, images, labels, decode_png=encoded == "png")


@pytest.mark.parametrize(
    ("encoded", "compression"), [(None, "fast"), ("png", "fast"), ("png", "small")]
)
def test_dali_reads_fashion_mnist_test_set_as_the_source_holds_it(
    tmp_path: Path, encoded: str | None, compression: str
) -> None:
    import gzip

    images_gz = fashion_file("t10k-images-idx3-ubyte.gz")
    labels_gz = fashion_file("t10k-labels-idx1-ubyte.gz")
    images = np.frombuffer(gzip.decompress(images_gz.read_bytes()), np.uint8, offset=16)
    labels = np.frombuffer(gzip.decompress(labels_gz.read_bytes()), np.uint8, offset=8)
    db = tmp_path / "db"
    mnist2db.convert(images_gz, labels_gz, db, encoded=encoded, png_compression=compression)
    check(db, images.reshape(-1, 28, 28), labels, decode_png=encoded == "png")


def test_dali_reads_a_shuffled_and_transposed_png_database_in_key_order(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    """The records as stored (shuffled, transposed): DALI and open_db agree on every one."""
    images_path, labels_path, _, _ = mnist_pair(600, rows=6, cols=9)
    db = tmp_path / "db"
    mnist2db.convert(
        images_path, labels_path, db, encoded="png", shuffle=True, seed=3, transpose=True
    )
    with mnist2db.open_db(db) as dataset:
        stored = [(image[0], label) for image, label in dataset]
    check(
        db,
        np.stack([image for image, _ in stored]),
        np.array([label for _, label in stored]),
        decode_png=True,
    )


def test_the_two_pipelines_of_docs_performance_run_as_written(
    tmp_path: Path, mnist_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python block of docs/performance.md (not run by tests/test_readme.py: it needs
    DALI), run here as written, over a raw and a PNG database at the path it names."""
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "performance.md").read_text()
    block = re.search(r"```python\n(from nvidia\.dali.*?)```", page, re.S)
    assert block is not None
    images_path, labels_path, images, labels = mnist_pair(300)
    sources = {image.tobytes(): int(label) for image, label in zip(images, labels, strict=True)}
    for encoded in ("png", None):
        mnist2db.convert(
            images_path, labels_path, tmp_path / (encoded or "raw") / "examples/mnist/mnist_train_lmdb",
            encoded=encoded,
        )  # fmt: skip
    # The block as written runs the PNG pipeline over a PNG database ...
    monkeypatch.chdir(tmp_path / "png")
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), "docs/performance.md", "exec"), namespace)
    outputs = [(namespace["images"], namespace["labels"])]
    # ... and defines the raw one, run here over a raw database.
    monkeypatch.chdir(tmp_path / "raw")
    pipe = namespace["raw_pipeline"]("examples/mnist/mnist_train_lmdb")
    pipe.build()
    outputs.append(pipe.run())
    for found, found_labels in outputs:
        batch = found.as_array()
        assert batch.shape == (256, 28, 28, 1) and batch.dtype == np.uint8
        for image, label in zip(batch, found_labels.as_array(), strict=True):
            assert sources[image[:, :, 0].tobytes()] == int(label[0])


def dali_webdataset(
    manifest: Path, ext: str, decode: bool, batch_size: int = 250
) -> tuple[list, list]:
    """Every sample of the shards ``manifest`` lists as DALI's ``fn.readers.webdataset``
    gives it, in order: (the image, decoded grey or its file's bytes; the label's text)."""
    import json

    from nvidia.dali import fn, pipeline_def, types

    listed = json.loads(manifest.read_text())
    paths = [str(manifest.parent / entry["name"]) for entry in listed["shards"]]

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipeline():  # type: ignore[no-untyped-def]
        image, label = fn.readers.webdataset(
            paths=paths, ext=[ext, "cls"], missing_component_behavior="error",
            random_shuffle=False, pad_last_batch=True, name="reader",
        )  # fmt: skip
        if decode:
            image = fn.decoders.image(image, device="cpu", output_type=types.GRAY)
        return image, label

    pipe = pipeline()
    pipe.build()
    total = pipe.epoch_size("reader")
    images: list[np.ndarray] = []
    labels: list[bytes] = []
    while len(images) < total:
        data, label = pipe.run()
        for i in range(len(data)):
            images.append(np.array(data.at(i)))
            labels.append(np.array(label.at(i)).tobytes())
    del pipe
    return images[:total], labels[:total]


@pytest.mark.parametrize("encoded", [None, "png"])
def test_dali_reads_exported_webdataset_shards(tmp_path: Path, encoded: str | None) -> None:
    """export --to webdataset of Fashion-MNIST's test set (raw records as PNGs, or the
    stored PNGs): DALI's webdataset reader gives back every image and label."""
    images_gz = fashion_file("t10k-images-idx3-ubyte.gz")
    labels_gz = fashion_file("t10k-labels-idx1-ubyte.gz")
    db = tmp_path / "db"
    mnist2db.convert(images_gz, labels_gz, db, count=2345, encoded=encoded)
    from mnist2db.exporting.webdataset.shards import export_webdataset

    result = export_webdataset(db, tmp_path / "shards" / "fashion", shard_size=1000)
    assert len(result.shards) == 3
    found, labels = dali_webdataset(Path(result.manifest), "png", decode=True)
    with mnist2db.open_db(db) as dataset:
        assert len(found) == len(dataset) == 2345
        for index, ((image, label), got, text) in enumerate(
            zip(dataset, found, labels, strict=True)
        ):
            assert got.shape == (28, 28, 1) and np.array_equal(got[:, :, 0], image[0]), index
            assert text == b"%d" % label, index


def test_dali_reads_the_stored_bytes_of_a_caffe_database(tmp_path: Path) -> None:
    """A convert_imageset --encoded database of JPEGs: DALI's webdataset reader hands out
    each record's stored bytes, unchanged."""
    from mnist2db.caffe_tools.convert_imageset import convert_imageset
    from mnist2db.exporting.webdataset.shards import export_webdataset

    corpus = Path(__file__).parent / "data" / "imageset"
    db = tmp_path / "db"
    listing = tmp_path / "jpegs.txt"
    lines = [line for line in (corpus / "all.txt").read_text().splitlines() if ".jpg " in line]
    listing.write_text("\n".join(lines) + "\n")
    assert convert_imageset(["--encoded", f"{corpus}/images/", str(listing), str(db)]) == 0
    result = export_webdataset(db, tmp_path / "jpegs")
    found, labels = dali_webdataset(Path(result.manifest), "jpg", decode=False, batch_size=4)
    records = list(mnist2db.iter_db(db))
    assert len(found) == len(records) == len(lines)
    for (_, datum), data, text in zip(records, found, labels, strict=True):
        assert data.tobytes() == datum.data and text == b"%d" % datum.label
