"""What real Caffe read from a pair mnist2db wrote, recorded (tests/data/labels/), so that
this test needs no Caffe: the same inputs written again give the same keys, a label blob
that prints as Caffe printed it, and images whose mean Caffe found equal to target 0.

Recorded with ``caffe test -model tests/data/labels/check_pair.prototxt -iterations 20``
(Caffe 1.0.0) on the pair this test writes; docs/labels.md explains the net."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from mnist2db import open_db
from mnist2db.cli.app import cli

RECORD = Path(__file__).resolve().parents[1] / "data" / "labels" / "caffe_check.json"


def build(root: Path) -> None:
    """photos/ of 20 grey 6 × 5 images and values.txt: each image's mean / 255, then two
    values that round (0.1 steps, a large one)."""
    rng = np.random.default_rng(2028)
    (root / "photos").mkdir()
    lines = []
    for i in range(20):
        image = rng.integers(0, 256, (6, 5), dtype=np.uint8)
        Image.fromarray(image).save(root / "photos" / f"p {i:02d}.png")
        lines.append(f"p {i:02d}.png {image.mean() / 255:.6f} {i / 10!r} {1e6 * i + 0.5!r}\n")
    (root / "values.txt").write_text("".join(lines))


def test_the_pair_reads_as_caffe_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = json.loads(RECORD.read_text())
    build(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["imageset", "--list", "values.txt", "--values", "3", "--gray", "--shuffle",
            "--seed", "11", "photos/", "db"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    with open_db("db", labels="db_labels") as db:
        assert [db.images.key(i).decode() for i in range(len(db))] == record["keys"]
        for (image, targets), printed, gap in zip(
            db, record["targets"], record["gap"], strict=True
        ):
            # Caffe's log prints floats with 6 significant digits, as %g does.
            assert [f"{v:g}" for v in targets.tolist()] == printed
            # Caffe's EuclideanLoss of (mean of the image blob scaled by 1/255, target 0).
            scaled = image.astype(np.float32) * np.float32(0.003921568859368563)
            ours = float((np.float32(scaled.mean()) - targets[0]) ** 2 / 2)
            assert abs(ours - float(gap)) < 1e-12
    assert float(record["gap_mean"]) < 1e-12  # every label blob came with its own image
