"""A fuzz of shard manifests (OUT.shards.json): random JSON values in every field, seeded.
Each case gives a one-line refusal or the correct result; never a traceback, never a file
touched outside the shards' folder, nor one in it that is not a shard of the export. The
loader on thousands of cases; the real ``export --overwrite`` / ``--resume`` on hundreds."""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import fashion_file
from test_hostile_export_shards import snapshot

from mnist2db import convert
from mnist2db.cli.app import cli
from mnist2db.errors import OutputExistsError

TOP = ["format", "version", "source", "shard_size", "shard_bytes", "label_db", "records",
       "classes", "targets", "complete", "shards", "replacing", "source_state", "extra"]  # fmt: skip
ENTRY = ["name", "records", "bytes", "sha256", "first_key_hex", "last_key_hex"]
STATE = ["records", "first_key_hex", "last_key_hex", "digest"]
TEXTS = ["", "ab", "a", "../victim.txt", "/etc/passwd", "s-000001.tar", "s-000009.tar",
         "../s-000000.tar", "s-000000.tar/../../victim.txt", "s-0000001.tar", "zz", "00",
         "3030303030303032", "ff" * 32, "s.shards.json", "s-00000a.tar", "."]  # fmt: skip
NUMBERS = [-1, 0, 1, 2, 3, 7, 1024, 1536, 10**30, 2**63, -(10**20), 0.5]


def random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(NUMBERS + [rng.randrange(-5, 5000)])
    if kind == 3:
        return rng.choice([math.inf, -math.inf, math.nan])
    if kind in (4, 5):
        return rng.choice(TEXTS + [rng.randbytes(rng.randrange(6)).hex()])
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return [rng.choice(TEXTS) for _ in range(rng.randrange(4))]
    return {rng.choice(ENTRY + TOP): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def near(rng: random.Random, value: object) -> object:
    """A value of the same type as ``value``, often one a check lets through."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return max(0, value + rng.choice([-1, 0, 1, 2]))
    if isinstance(value, str):
        return rng.choice([value, value[:-2], value + "00", rng.randbytes(len(value) // 2).hex()])
    if isinstance(value, list):
        return value[: rng.randrange(len(value) + 1)]
    return value


def mutated(rng: random.Random, manifest: dict) -> dict:
    """``manifest`` with 1 to 3 fields set to random values (or removed): at the top, in a
    shard entry, in the source's state, a name in ``replacing``."""
    found = copy.deepcopy(manifest)
    for _ in range(rng.randrange(1, 4)):
        place = rng.random()
        if place < 0.4 or not found.get("shards") or not isinstance(found["shards"], list):
            target, fields = found, TOP
        elif place < 0.75:
            i = rng.randrange(len(found["shards"]))
            if not isinstance(found["shards"][i], dict) or rng.random() < 0.1:
                found["shards"][i] = random_value(rng)
                continue
            target, fields = found["shards"][i], ENTRY
        elif place < 0.85 and isinstance(found.get("source_state"), dict):
            target, fields = found["source_state"], STATE
        else:
            found["replacing"] = [rng.choice(TEXTS) for _ in range(rng.randrange(1, 3))]
            continue
        field = rng.choice(fields)
        chance = rng.random()
        if chance < 0.15:
            target.pop(field, None)
        elif chance < 0.5 and field in target:
            target[field] = near(rng, target[field])
        else:
            target[field] = random_value(rng)
    return found


def fashion_db(path: Path, count: int) -> Path:
    convert(fashion_file("t10k-images-idx3-ubyte"), fashion_file("t10k-labels-idx1-ubyte"), path,
            count=count)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, object]:
    """A database, its whole export (4 shards of 2, 2, 2, 1), and the manifests of it
    complete and as a kill leaves it (2 shards listed)."""
    root = tmp_path_factory.mktemp("fuzz")
    db = fashion_db(root / "db", 7)
    whole = root / "whole" / "s"
    result = CliRunner().invoke(cli, ["export", "--to", "webdataset", "--shard-size", "2",
                                      str(db), str(whole)])  # fmt: skip
    assert result.exit_code == 0, result.output
    complete = json.loads(Path(f"{whole}.shards.json").read_text())
    killed = copy.deepcopy(complete)
    killed["shards"], killed["complete"] = killed["shards"][:2], False
    return {"db": db, "whole": whole, "complete": complete, "killed": killed}


def test_manifest_loader_fuzz(bases, tmp_path: Path) -> None:
    from mnist2db.exporting.webdataset.shard_files import read_manifest, shard_name_pattern

    rng = random.Random(20261208)
    out = tmp_path / "s"
    path = Path(f"{out}.shards.json")
    pattern = shard_name_pattern(str(out))
    counts = {"cases": 0, "refused": 0, "accepted": 0}
    for case in range(4000):
        base = bases["complete"] if case % 2 else bases["killed"]
        manifest = mutated(rng, base)
        path.write_text(json.dumps(manifest))
        counts["cases"] += 1
        try:
            found = read_manifest(str(path), str(out))
        except OutputExistsError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message, message
            counts["refused"] += 1
            continue
        # Accepted: what mnist2db would act on is as it writes it.
        assert found is not None
        names = [entry["name"] for entry in found["shards"]] + found["replacing"]
        assert all(pattern.fullmatch(name) for name in names), names
        assert all(type(entry["records"]) is int for entry in found["shards"])
        assert type(found["records"]) is int and 0 <= found["records"] < 2**63
        counts["accepted"] += 1
    print(f"manifest loader fuzz: {counts}")
    assert counts["refused"] > 1000 and counts["accepted"] > 100  # both outcomes exercised


@pytest.mark.parametrize("seed", range(4))
def test_export_overwrite_and_resume_fuzz(bases, tmp_path: Path, seed: int) -> None:
    """The real export on mutated manifests: exit 0 with the whole export's bytes, or exit 1
    with one line and nothing changed; the user's files beside the shards and outside
    their folder never touched."""
    rng = random.Random(seed)
    whole: Path = bases["whole"]  # type: ignore[assignment]
    expected = {Path(k).name: v for k, v in snapshot(whole.parent).items()}
    counts = {"cases": 0, "refused": 0, "correct": 0}
    for case in range(60):
        work = tmp_path / f"case{case}"
        folder = work / "shards"
        shutil.copytree(whole.parent, folder)
        (work / "victim.txt").write_text("outside")
        for name in ("a", "b", "victim.txt"):
            (folder / name).write_text(f"the user's {name}")
        base = bases["complete"] if rng.random() < 0.5 else bases["killed"]
        if base is bases["killed"]:
            for name in ("s-000002.tar", "s-000003.tar"):
                (folder / name).unlink()
        manifest = mutated(rng, base)
        (folder / "s.shards.json").write_text(json.dumps(manifest))
        mode = rng.choice(["--overwrite", "--resume"])
        outside = {k: v for k, v in snapshot(work).items() if not k.startswith(str(folder))}
        users = {n: (folder / n).read_bytes() for n in ("a", "b", "victim.txt")}
        before = snapshot(folder)
        result = CliRunner().invoke(cli, ["export", "--to", "webdataset", "--shard-size", "2",
                                          mode, str(bases["db"]), str(folder / "s")])  # fmt: skip
        counts["cases"] += 1
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            manifest,
            result.exception,
        )
        assert "Traceback" not in result.output
        assert {k: v for k, v in snapshot(work).items() if not k.startswith(str(folder))} == outside
        assert {n: (folder / n).read_bytes() for n in users} == users
        if result.exit_code == 0:
            found = {Path(k).name: v for k, v in snapshot(folder).items()}
            for name in users:
                del found[name]
            assert found == expected, (mode, manifest)
            counts["correct"] += 1
        else:
            assert result.exit_code == 1 and result.stderr.startswith("Error: ")
            assert result.stderr.count("\n") == 1, result.stderr
            assert snapshot(folder) == before, (mode, manifest, result.stderr)
            counts["refused"] += 1
        shutil.rmtree(work)
    print(f"export fuzz (seed {seed}): {counts}")
    assert counts["cases"] == counts["refused"] + counts["correct"]
