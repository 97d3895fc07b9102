"""The convert_imageset drop-in against Caffe's own output on the recorded corpus.

tests/data/imageset holds small generated images in every promised format and layout,
the list files, and digests.json: for each run (flags and list) and backend, every key
Caffe's convert_imageset wrote and the SHA-256 of its value (made by make_corpus.py with
a real Caffe build; Caffe is not needed here).
"""

from __future__ import annotations

import importlib.util
import json
import os
from types import ModuleType

import pytest

from mnist2db.caffe_tools.convert_imageset import convert_imageset
from mnist2db.formats.imread.cv2_wheel import NO_OPENCV

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, "data", "imageset")
with open(os.path.join(CORPUS, "digests.json"), encoding="utf-8") as _stream:
    DIGESTS = json.load(_stream)


def _corpus_script() -> ModuleType:
    """make_corpus.py, which wrote digests.json: its reader of a database's digests."""
    spec = importlib.util.spec_from_file_location(
        "make_corpus", os.path.join(CORPUS, "make_corpus.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


read_db = _corpus_script().read_db


RUNS = [(name, backend) for name in sorted(DIGESTS["runs"]) for backend in ("lmdb", "leveldb")]


DECODERS = [("--jobs=1", "opencv"), ("-j=2", "opencv"), ("-j=2", "pure")]


@pytest.mark.parametrize(("jobs", "decoder"), DECODERS, ids=[f"{j}-{d}" for j, d in DECODERS])
@pytest.mark.parametrize(("name", "backend"), RUNS, ids=[f"{n}-{b}" for n, b in RUNS])
def test_matches_caffe(
    tmp_path, capsys, monkeypatch, name: str, backend: str, jobs: str, decoder: str
) -> None:
    """Every run, decoded by one worker process and by two, with OpenCV's wheel (where
    installed: a dependency where it has a wheel) and without: Caffe's records every way."""
    if decoder == "pure":
        monkeypatch.setenv(NO_OPENCV, "1")
    run = DIGESTS["runs"][name]
    out = str(tmp_path / "db")
    root = os.path.join(CORPUS, "images") + "/"
    code = convert_imageset(
        [*run["flags"], jobs, f"--backend={backend}", root, os.path.join(CORPUS, run["list"]), out]
    )
    assert code == 0, capsys.readouterr().err
    expected = run[backend]
    assert len(expected) > 3
    got = read_db(out, backend)
    assert sorted(got) == sorted(expected)
    differing = [key for key in expected if got[key] != expected[key]]
    assert differing == []


def test_corpus_covers_every_flag() -> None:
    flags = {flag.split("=")[0] for run in DIGESTS["runs"].values() for flag in run["flags"]}
    assert flags == {
        "--gray", "--resize_width", "--resize_height", "--encoded", "--encode_type",
        "--check_size",
    }  # fmt: skip
    types = {
        f.split("=")[1] for r in DIGESTS["runs"].values() for f in r["flags"] if "encode_type" in f
    }
    assert types == {"png", "jpg"}
