"""``--png-compression fast|small``: the choice of PNG deflate, on ``convert``,
``create`` and the Python API, recorded in mnist2db.json so that ``verify`` encodes alike."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import mnist2db
from mnist2db.cli.app import cli
from mnist2db.errors import ArgumentError, VerifyError
from mnist2db.formats.png.encoder import encode_png_batch
from mnist2db.recipe import read_metadata
from mnist2db.storage.databases.backends import METADATA_NAME
from mnist2db.storage.databases.readers import open_reader
from mnist2db.verify import verify_db

Pair = Callable[..., tuple[Path, Path, np.ndarray, np.ndarray]]


def run(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def values(db: Path) -> list[bytes]:
    with open_reader(str(db)) as reader:
        return [bytes(v) for _, v in reader]


@pytest.fixture
def byte_exact_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify accepts other PNG bytes of the same pixels; without that, only the records
    its own encoder gives pass, which shows which compression it encoded with."""
    import mnist2db.verify

    monkeypatch.setattr(mnist2db.verify, "_same_decoded", lambda *args: False)


def pair(mnist_pair: Pair) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    images_path, labels_path, images, labels = mnist_pair(130, rows=9, cols=8)
    return images_path, labels_path, images, labels


@pytest.mark.parametrize("compression", [None, "fast", "small"])
def test_convert_writes_records_verify_encodes_alike(
    tmp_path: Path, mnist_pair: Pair, byte_exact_verify: None, compression: str | None
) -> None:
    images_path, labels_path, images, labels = mnist_pair(1100, rows=9, cols=8)
    images[::4] = 0  # runs
    from helpers import write_idx

    write_idx(images_path, images)
    db = tmp_path / "db"
    option = [] if compression is None else ["--png-compression", compression]
    result = run("convert", "-q", "--encoded", "png", *option, images_path, labels_path, db)
    assert result.exit_code == 0, result.output
    used = compression or "fast"
    assert values(db) == encode_png_batch(images, labels.astype(np.int64), used)
    assert json.loads((db / METADATA_NAME).read_text())["png_compression"] == used
    found = read_metadata(db)
    assert found is not None and found[0].png_compression == used
    assert verify_db(db, images_path, labels_path).count == 1100
    checked = run("verify", db, images_path, labels_path)
    assert checked.exit_code == 0, checked.output
    # The other compression's records are not what this database's recipe makes.
    other = "small" if used == "fast" else "fast"
    meta = db / METADATA_NAME
    meta.write_text(meta.read_text().replace(f'"{used}"', f'"{other}"'))
    with pytest.raises(VerifyError, match=r": key 0000000\d: value of \d+ bytes is not Caffe's"):
        verify_db(db, images_path, labels_path)


def test_a_recipe_without_the_field_was_written_small(
    tmp_path: Path, mnist_pair: Pair, byte_exact_verify: None
) -> None:
    """Databases written before the choice existed hold zlib's records and no field."""
    images_path, labels_path, _, _ = mnist_pair(40, rows=5, cols=6)
    db = tmp_path / "db"
    mnist2db.convert(images_path, labels_path, db, encoded="png", png_compression="small")
    meta = db / METADATA_NAME
    metadata = json.loads(meta.read_text())
    del metadata["png_compression"]
    meta.write_text(json.dumps(metadata, indent=1) + "\n")
    found = read_metadata(db)
    assert found is not None and found[0].png_compression == "small"
    assert verify_db(db, images_path, labels_path).count == 40
    shown = run("info", db)
    assert shown.exit_code == 0, shown.output
    assert (
        "encoded     PNG images in Datum.data (encoded: true), --png-compression small\n"
        in shown.stdout
    )
    # Raw databases record no compression.
    raw = tmp_path / "raw"
    mnist2db.convert(images_path, labels_path, raw, shuffle=True, seed=3)
    assert "png_compression" not in json.loads((raw / METADATA_NAME).read_text())
    found = read_metadata(raw)
    assert found is not None and found[0].png_compression is None


def test_png_compression_without_encoded_png_is_a_usage_error(
    tmp_path: Path, mnist_pair: Pair
) -> None:
    images_path, labels_path, _, _ = mnist_pair(5)
    for command in (
        ["convert", "--png-compression", "small", images_path, labels_path, tmp_path / "db"],
        ["convert", "--png-compression", "fast", images_path, labels_path, tmp_path / "db"],
        ["create", "--png-compression", "small", "--data", tmp_path, "--out", tmp_path / "o"],
    ):
        result = run(*command)
        assert result.exit_code == 2
        assert result.stderr.splitlines()[-1] == (
            "Error: --png-compression compresses PNG records: add --encoded png"
        )
    bad = run("convert", "--encoded", "png", "--png-compression", "tiny", images_path,
              labels_path, tmp_path / "db")  # fmt: skip
    assert bad.exit_code == 2 and "'tiny' is not one of 'fast', 'small'" in bad.stderr
    assert sorted(os.listdir(tmp_path)) == sorted([images_path.name, labels_path.name])


def test_the_library_refuses_in_one_line(tmp_path: Path, mnist_pair: Pair) -> None:
    images_path, labels_path, _, _ = mnist_pair(5)
    with pytest.raises(ArgumentError) as caught:
        mnist2db.convert(images_path, labels_path, tmp_path / "a", png_compression="small")
    assert str(caught.value) == (
        "PNG compression 'small' compresses PNG records: ask for encoded='png' too"
    )
    with pytest.raises(ArgumentError) as caught:
        mnist2db.convert(
            images_path, labels_path, tmp_path / "b", encoded="png", png_compression="best"
        )
    assert str(caught.value) == "unknown PNG compression 'best': expected one of fast, small"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_create_passes_the_choice_to_both_splits(
    tmp_path: Path, mnist_pair: Pair, byte_exact_verify: None
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    sources = {}
    for stem in ("train", "t10k"):
        images_path, labels_path, images, labels = mnist_pair(
            20, rows=4, cols=4, stem=stem, seed=len(stem)
        )
        os.replace(images_path, data / images_path.name)
        os.replace(labels_path, data / labels_path.name)
        sources[stem] = (data / images_path.name, data / labels_path.name, images, labels)
    made = run("create", "-q", "--data", data, "--out", tmp_path / "ex", "--encoded", "png",
               "--png-compression", "small")  # fmt: skip
    assert made.exit_code == 0, made.output
    for stem, split in (("train", "train"), ("t10k", "test")):
        db = tmp_path / "ex" / f"mnist_{split}_lmdb"
        images_path, labels_path, images, labels = sources[stem]
        assert values(db) == encode_png_batch(images, labels.astype(np.int64), "small")
        assert verify_db(db, images_path, labels_path).count == 20


def test_encode_png_takes_the_same_choice() -> None:
    from mnist2db.formats.png.encoder import encode_png

    image = np.zeros((30, 40), np.uint8)
    image[3:20, 5:9] = 200
    fast, small = encode_png(image, "fast"), encode_png(image, "small")
    assert fast != small and encode_png(image) == fast
    for png, compression in ((fast, "fast"), (small, "small")):
        values = encode_png_batch(image[None], np.array([4]), compression)
        assert png in values[0]
    with pytest.raises(ArgumentError, match=r"^unknown PNG compression 'gzip': expected one of"):
        encode_png(image, "gzip")
    with pytest.raises(ArgumentError, match=r"^unknown PNG compression 'gzip'"):
        encode_png_batch(image[None], np.array([4]), "gzip")
