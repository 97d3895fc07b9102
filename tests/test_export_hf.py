"""Hugging Face ``datasets`` reads what export writes: the ``imagefolder`` loader the tree of
``export --to files``, the ``webdataset`` loader the shards (docs/leaving-caffe.md).

``datasets`` is not a test dependency: it brings pyarrow and pandas (about 420 MB installed,
18 s from wheels here), and pandas 3 needs a newer numpy than the floor run pins
(constraints/floor.txt), so these tests run where it is installed and are skipped elsewhere.
Offline: the loaders read local files only, their cache in the test's directory.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import fashion_file
from PIL import Image

from mnist2db import convert, open_db
from mnist2db.exporting.image_files.folder import export_files
from mnist2db.exporting.webdataset.shards import export_webdataset


@pytest.fixture
def load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name, value in (("HF_HOME", tmp_path / "hf"), ("HF_DATASETS_OFFLINE", "1"),
                        ("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")):  # fmt: skip
        monkeypatch.setenv(name, str(value))
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is not installed")
    return lambda *args, **kwargs: datasets.load_dataset(
        *args, cache_dir=str(tmp_path / "cache"), **kwargs
    )


def _fashion(tmp_path: Path, count: int = 120) -> tuple[Path, list[np.ndarray], list[int]]:
    db = tmp_path / "fashion_lmdb"
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), db,
            count=count)  # fmt: skip
    images, labels = zip(*[(image[0], int(label)) for image, label in open_db(db)], strict=True)
    return db, list(images), list(labels)


def _pixels(picture: Image.Image) -> np.ndarray:
    return np.asarray(picture)


def test_imagefolder_reads_the_exported_tree(tmp_path: Path, load_dataset) -> None:  # type: ignore[no-untyped-def]
    db, images, labels = _fashion(tmp_path)
    out = tmp_path / "files"
    export_files(db, out)
    ds = load_dataset("imagefolder", data_dir=str(out), split="train")
    assert ds.num_rows == len(images) and ds.column_names == ["image", "label"]
    names = ds.features["label"].names  # the folder names, sorted: the labels as text
    assert names == sorted({str(label) for label in labels})
    wanted = {}  # (pixels, label) of every record: the loader's order is its own
    for image, label in zip(images, labels, strict=True):
        wanted.setdefault(image.tobytes(), []).append(label)
    for row in ds:
        found = _pixels(row["image"])
        assert found.shape == (28, 28)
        assert int(names[row["label"]]) in wanted[found.tobytes()]


def test_webdataset_loader_reads_the_shards(tmp_path: Path, load_dataset) -> None:  # type: ignore[no-untyped-def]
    db, images, labels = _fashion(tmp_path)
    out = tmp_path / "shards" / "fashion"
    export_webdataset(db, out, shard_size=50)
    shards = sorted(str(p) for p in out.parent.glob("fashion-*.tar"))
    assert len(shards) == 3
    ds = load_dataset("webdataset", data_files={"train": shards}, split="train")
    assert ds.num_rows == len(images)
    assert set(ds.column_names) == {"__key__", "__url__", "png", "cls"}
    for i, row in enumerate(ds):  # in key order
        assert row["__key__"] == f"{i:08d}" and row["cls"] == labels[i]
        assert (_pixels(row["png"]) == images[i]).all()


def test_webdataset_loader_reads_the_targets(tmp_path: Path, load_dataset) -> None:  # type: ignore[no-untyped-def]
    from db_helpers import write_labels

    db, images, _ = _fashion(tmp_path, 20)
    rows = np.stack([image.mean(axis=(0, 1)) for image in images]).astype(np.float32)[:, None]
    rows = np.hstack([rows / 255, rows / 3]).astype(np.float32)
    write_labels(tmp_path / "fashion_lmdb_labels", rows)
    out = tmp_path / "shards" / "t"
    export_webdataset(db, out, label_db=tmp_path / "fashion_lmdb_labels")
    ds = load_dataset("webdataset", data_files={"train": [f"{out}-000000.tar"]}, split="train")
    assert set(ds.column_names) == {"__key__", "__url__", "png", "cls", "json"}
    for i, row in enumerate(ds):
        found = row["json"] if isinstance(row["json"], dict) else json.loads(row["json"])
        assert found["key"] == f"{i:08d}"
        assert (np.float32(found["targets"]) == rows[i]).all()
        assert isinstance(row["png"], Image.Image) or io.BytesIO(row["png"])
