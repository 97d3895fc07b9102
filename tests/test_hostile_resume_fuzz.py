"""Fuzzed staged runs before --resume: staged databases cut at random lengths, page bytes
changed, replaced, linked; plans with random JSON in every field. Each resume runs in a
child process: a one-line refusal or the uninterrupted records, never a signal (a negative
return code) or a traceback. A seeded run; the counts are printed (``-s``)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import test_hostile_resume as base
from test_hostile_resume import PLAN, convert, file_digest, records, stage_copy, staged

from mnist2db.errors import Mnist2dbError
from mnist2db.imageset.resume import StagedRun, check_plan, read_plan

photos = base.photos  # the fixtures
runs = base.runs

STAGED_CASES = 36
PLAN_CASES = 3000
COMMAND_PLAN_CASES = 24
PAGE = 4096


def outcome(done: subprocess.CompletedProcess[str], out: Path, whole: object) -> str:
    """'refused' or 'correct'; fails on anything else (a signal, a traceback, two lines,
    another result)."""
    assert done.returncode >= 0, f"ended by signal {-done.returncode}: {done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        assert records(out) == whole and staged(out) == []
        return "correct"
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "--resume refused" in lines[0], lines[0]
    assert not out.exists()
    return "refused"


def mutate_staged(
    rng: random.Random, copy: Path, other: Path, aside: Path
) -> tuple[str, Path | None]:
    """One change of the staged database in ``copy``; returns its kind and a file outside the
    staging directory that must stay as it was (or None)."""
    data = copy / "data.mdb"
    size = data.stat().st_size
    kind = rng.choice(["cut", "cut", "page bytes", "page bytes", "zeroed page", "replaced",
                       "symbolic link", "hard link", "foreign file", "lock link"])  # fmt: skip
    if kind == "cut":
        os.truncate(data, rng.randrange(size))
    elif kind == "page bytes":  # a page's header or a meta page: what liblmdb trusts
        with open(data, "r+b") as stream:
            for _ in range(rng.randint(1, 4)):
                page = rng.randrange(size // PAGE)
                stream.seek(page * PAGE + rng.randrange(136 if page < 2 else 16))
                stream.write(bytes([rng.randrange(256)]))
    elif kind == "zeroed page":  # a page a power cut never wrote
        with open(data, "r+b") as stream:
            stream.seek(rng.randrange(size // PAGE) * PAGE)
            stream.write(bytes(PAGE))
    elif kind == "replaced":
        shutil.copyfile(other / "data.mdb", copy / "new")
        os.replace(copy / "new", data)
    elif kind in ("symbolic link", "hard link", "lock link"):
        aside.mkdir(exist_ok=True)
        target = aside / f"{kind.replace(' ', '-')}.mdb"
        if kind == "hard link":
            os.link(data, target)
        else:
            shutil.copyfile(other / "data.mdb", target)
            name = data if kind == "symbolic link" else copy / "lock.mdb"
            if os.path.lexists(name):
                os.unlink(name)
            os.symlink(target, name)
        return kind, target
    else:
        (copy / "notes.txt").write_text("mine")
        return kind, copy / "notes.txt"
    return kind, None


def test_fuzzed_staged_databases_are_refused_or_resumed_never_a_signal(
    photos: Path, tmp_path: Path, runs: dict[str, Any]
) -> None:
    rng = random.Random(20261208)
    counts: Counter[str] = Counter()
    kinds: Counter[tuple[str, str]] = Counter()
    for case in range(STAGED_CASES):
        out = tmp_path / f"db{case}"
        copy = stage_copy(runs, out)
        kind, kept = mutate_staged(rng, copy, runs["other"], tmp_path / f"aside{case}")
        before = file_digest(kept) if kept is not None else None
        done = convert(photos, out, resume=True)
        assert done.returncode >= 0, (case, kind, done.returncode, copy)
        result = outcome(done, out, runs["whole"])
        if kept is not None:
            assert file_digest(kept) == before, (kind, kept)
        counts[result] += 1
        kinds[kind, result] += 1
    print(f"\nstaged databases: {STAGED_CASES} cases, {dict(counts)}; {dict(kinds)}")
    assert counts["refused"] + counts["correct"] == STAGED_CASES and counts["refused"]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(12 if depth < 3 else 8)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, -1, 2, 32, 10**8, 10**8 + 1, 2**63, -(2**63), 10**40])
    if pick == 3:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), 32.0])
    if pick == 4:
        return rng.choice(["", "lmdb", "leveldb", "x" * 300, "\udcff", "0" * 64, "f" * 64,
                           "3030303030303030" + "5f", "list.txt", "jpg"])  # fmt: skip
    if pick == 5:
        return "".join(rng.choice('0123456789abcdef_ \n"\\') for _ in range(rng.randrange(80)))
    if pick == 6:
        return rng.randrange(-5, 2**40)
    if pick == 7:
        return [rng.randrange(1, 100), rng.randrange(1, 100)]
    if pick in (8, 9):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["device", "inode", "states", "x", ""]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutate_plan(rng: random.Random, plan: dict[str, Any]) -> str:
    """The plan's text with one field (or the staged identity's, or the whole) changed."""
    plan = json.loads(json.dumps(plan))
    where = rng.randrange(10)
    if where == 0:
        return json.dumps(random_json(rng))
    if where == 1:
        return rng.choice(["", "{", "[" * 100000, "\xff", '{"a": 1}' * 3, "null"])
    if where in (2, 3) and plan["staged"] is not None:
        staged = plan["staged"]
        field = rng.choice(["device", "inode", "states", "states0", "states1", "extra"])
        if field.startswith("states") and field != "states":
            state = staged["states"][int(field[-1])]
            state[rng.randrange(3)] = random_json(rng)
        else:
            staged[field] = random_json(rng)
        return json.dumps(plan)
    field = rng.choice([*plan, "unknown"])
    if rng.randrange(6) == 0:
        plan.pop(field, None)
    else:
        plan[field] = random_json(rng)
    return json.dumps(plan)


def test_fuzzed_plans_give_the_plan_or_one_line_never_another_error(
    tmp_path: Path, runs: dict[str, Any]
) -> None:
    rng = random.Random(8)
    source = runs["staging"] / PLAN
    base = read_plan(str(source))
    assert base is not None
    path = tmp_path / PLAN
    counts: Counter[str] = Counter()
    for _ in range(PLAN_CASES):
        path.write_text(mutate_plan(rng, base), errors="surrogateescape")
        try:
            plan = read_plan(str(path))
        except Mnist2dbError as exc:
            message = str(exc)
            assert "\n" not in message and message.startswith(f"{path}: --resume refused: ")
            counts["refused by the loader"] += 1
            continue
        assert plan is not None
        try:
            check_plan("db", StagedRun(str(tmp_path), plan), base)
        except Mnist2dbError as exc:
            assert "\n" not in str(exc) and "--resume refused" in str(exc)
            counts["refused: another run's plan"] += 1
            continue
        counts["accepted"] += 1
    print(f"\nplans: {PLAN_CASES} cases, {dict(counts)}")
    assert sum(counts.values()) == PLAN_CASES and counts["refused by the loader"] > PLAN_CASES // 2


def test_fuzzed_plans_through_the_real_resume(
    photos: Path, tmp_path: Path, runs: dict[str, Any]
) -> None:
    rng = random.Random(5)
    counts: Counter[str] = Counter()
    for case in range(COMMAND_PLAN_CASES):
        out = tmp_path / f"db{case}"
        copy = stage_copy(runs, out)
        plan = json.loads((copy / PLAN).read_text())
        (copy / PLAN).write_text(mutate_plan(rng, plan), errors="surrogateescape")
        counts[outcome(convert(photos, out, resume=True), out, runs["whole"])] += 1
    print(f"\nplans through --resume: {COMMAND_PLAN_CASES} cases, {dict(counts)}")
    assert sum(counts.values()) == COMMAND_PLAN_CASES


def test_an_unchanged_copy_is_resumed(photos: Path, tmp_path: Path, runs: dict[str, Any]) -> None:
    """The fuzz's control: the copy as staged resumes to the uninterrupted records."""
    out = tmp_path / "db"
    stage_copy(runs, out)
    assert outcome(convert(photos, out, resume=True), out, runs["whole"]) == "correct"
