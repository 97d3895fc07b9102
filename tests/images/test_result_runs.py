"""Small records as runs (mnist2db.imageset.workers.messages.Run), with real forked workers:
records of one layout come as runs framed as the records' digest frames them, a layout
that changes or an image that cannot be read starts a new run, and a worker that forges a
run (another key, a length field that lies, more records than its task, a run where no
keys were asked for) costs its own image only; the batches built from runs hash as the
records they hold."""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import sys

import pytest

from mnist2db.formats.lists.image_list import ListEntry, image_key
from mnist2db.imageset.batches import record_batches
from mnist2db.imageset.workers import loop as worker_loop
from mnist2db.imageset.workers.messages import ResultMessage, Run, send_message
from mnist2db.imageset.workers.pool import OrderedDecoding
from mnist2db.storage.record_digest import RecordDigest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="real forked workers")


def _record(line: int) -> bytes:
    """A small record whose bytes name its line; every seventh a byte longer."""
    return b"rec%05d" % line + (b"+" if line % 7 == 0 else b"")


def _framed(key: bytes, value: bytes) -> bytes:
    return struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value


class Work:
    """A small record per entry (``bad``: unreadable); a name starting with ``forge-`` makes
    the worker send a forged run on its own pipe first (as :func:`serve`'s own message
    would be), then its real result."""

    def __call__(self, entry: ListEntry) -> object:
        name = entry.path.decode()
        if name == "bad":
            return "bad: cannot read it"
        if name.startswith("forge-"):
            serve = sys._getframe()
            while serve.f_code is not worker_loop.serve.__code__:
                serve = serve.f_back  # type: ignore[assignment]
            kind = name[6:]
            parts = _garbled[kind] if kind in _garbled else _forged(kind, entry).parts()
            send_message(serve.f_locals["out"], parts)
        return (_record(entry.line), (1, 1, len(_record(entry.line))))


def _forged(kind: str, entry: ListEntry) -> ResultMessage:
    key, value = image_key(entry), _record(entry.line)
    message = ResultMessage(None)
    layout = [1, len(key), len(value)]
    frames = _framed(key, value)
    if kind == "key":  # another entry's key, of the same length
        frames = _framed(key[:-1] + b"X", value)
    elif kind == "length":  # a frame whose value length is not the run's
        frames = struct.pack(">I", len(key)) + key + struct.pack(">I", 0) + value
    elif kind == "count":  # more records than the task holds, framed rightly
        layout[0] = 1000
        frames *= 1000
    elif kind == "layout":  # not a layout at all
        layout = [1, -5, len(value)]
    message.sizes.append(layout)
    message.rest.append(((1, 1, len(value)),))
    message.blobs.append(frames)
    return message


def _message(pickled: bytes) -> list[bytes]:
    """A message whose header is ``pickled`` as it is (Connection's framing, the size)."""
    body = struct.pack("<I", len(pickled)) + pickled
    return [struct.pack("!i", len(body)) + body]


#: Messages whose header is not one a worker makes: each unpickles to an error of its own.
_garbled = {
    "truncated": _message(pickle.dumps(([1], [2]))[:-3]),  # UnpicklingError
    "global": _message(b"cnosuchmodule\nthing\n."),  # ModuleNotFoundError
    "empty": _message(b""),  # EOFError
    "number": _message(pickle.dumps(7)),  # TypeError: not a pair
    "uneven": _message(pickle.dumps(([5, 6], [()]))),  # ValueError: zip(strict=True)
}


def _expand(items: list[object]) -> list[tuple[ListEntry, object]]:
    out: list[tuple[ListEntry, object]] = []
    for item in items:
        if type(item) is Run:
            out.extend(
                (entry, bytes(value))
                for entry, (_, value) in zip(item.entries, item.pairs, strict=True)
            )
        else:
            entry, result = item  # type: ignore[misc]
            out.append((entry, result if isinstance(result, str) else bytes(result[0])))
    return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_small_records_come_as_runs_of_one_layout_under_their_own_keys(jobs: int) -> None:
    names = [f"image{i}" for i in range(200)]
    names[50] = names[51] = "bad"
    listed = [ListEntry(i, name.encode(), i % 3) for i, name in enumerate(names)]
    with OrderedDecoding(listed, Work(), b"", jobs, preload=None, keys=image_key) as decoding:
        items = list(decoding.runs())
    runs = [item for item in items if type(item) is Run]
    assert runs and sum(run.count for run in runs) == 198
    for run in runs:
        # One layout a run, its frames the digest's, its pairs the entries' keys and records.
        assert len({len(value) for _, value in run.pairs}) == 1
        assert bytes(run.framed) == b"".join(_framed(k, v) for k, v in run.pairs)
        assert [key for key, _ in run.pairs] == [image_key(e) for e in run.entries]
    got = _expand(items)
    assert [entry for entry, _ in got] == listed
    for entry, result in got:
        if entry.path == b"bad":
            assert result == "bad: cannot read it"
        else:
            assert result == _record(entry.line)


def test_without_keys_no_run_is_made() -> None:
    listed = [ListEntry(i, b"image%d" % i, 0) for i in range(40)]
    with OrderedDecoding(listed, Work(), b"", 1, preload=None) as decoding:
        items = list(decoding.runs())
    assert not any(type(item) is Run for item in items)
    assert [bytes(result[0]) for _, result in items] == [_record(i) for i in range(40)]


@pytest.mark.parametrize("kind", ["key", "length", "count", "layout"])
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_that_forges_a_run_costs_its_image_only(kind: str, jobs: int) -> None:
    names = [f"image{i}" for i in range(90)]
    names[4] = names[61] = f"forge-{kind}"
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]
    with OrderedDecoding(listed, Work(), b"", jobs, preload=None, keys=image_key) as decoding:
        got = _expand(list(decoding.runs()))
    assert [entry for entry, _ in got] == listed
    why = (
        "sent more results than it was given images"
        if kind == "count"
        else ("sent a result that is not one")
    )
    for line in (4, 61):
        assert got[line][1] == f"forge-{kind}: cannot read it: its decoder {why} (killed)"
    assert [r for i, (_, r) in enumerate(got) if i not in (4, 61)] == [
        _record(i) for i in range(90) if i not in (4, 61)
    ]


@pytest.mark.parametrize("kind", sorted(_garbled))
def test_a_worker_whose_message_does_not_unpickle_costs_its_image_only(kind: str) -> None:
    names = [f"image{i}" for i in range(30)]
    names[7] = f"forge-{kind}"
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]
    with OrderedDecoding(listed, Work(), b"", 2, preload=None, keys=image_key) as decoding:
        got = _expand(list(decoding.runs()))
    assert [entry for entry, _ in got] == listed
    assert got[7][1] == (
        f"forge-{kind}: cannot read it: its decoder sent a result that is not one (killed)"
    )
    assert [r for i, (_, r) in enumerate(got) if i != 7] == [
        _record(i) for i in range(30) if i != 7
    ]


def test_a_run_where_no_keys_were_asked_for_costs_its_image_only() -> None:
    names = [f"image{i}" for i in range(20)]
    names[9] = "forge-key"  # any run: the parent asked for none
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]
    with OrderedDecoding(listed, Work(), b"", 1, preload=None) as decoding:
        got = _expand(list(decoding.runs()))
    assert (
        got[9][1] == "forge-key: cannot read it: its decoder sent a result that is not one (killed)"
    )
    assert [r for i, (_, r) in enumerate(got) if i != 9] == [
        _record(i) for i in range(20) if i != 9
    ]


@pytest.mark.parametrize(("batch_size", "jobs"), [(1000, 2), (7, 1), (7, 2), (1, 2)])
def test_batches_of_runs_are_the_records_one_by_one_and_hash_as_them(
    batch_size: int, jobs: int
) -> None:
    """The batches made from runs (split where a batch ends) hold the records the
    per-record path makes, in the same batches, and their digest is the records'."""
    names = [f"image{i}" for i in range(300)]
    names[100] = "bad"
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]

    def batches(keys: object) -> list[list[tuple[bytes, bytes]]]:
        state = {"count": 0, "shape": None, "mixed": False}
        skipped: list[ListEntry] = []
        with OrderedDecoding(listed, Work(), b"", jobs, preload=None,
                             keys=keys) as decoding:  # type: ignore[arg-type]  # fmt: skip
            made = [
                [(bytes(k), bytes(v)) for k, v in batch]
                for batch in _hashed(
                    record_batches(
                        decoding.runs(),
                        False,
                        batch_size,
                        state,
                        lambda e, _: skipped.append(e),
                        "list",
                    )  # fmt: skip
                )
            ]
        assert [e.line for e in skipped] == [100]
        assert state["count"] == 299 and state["mixed"]
        return made

    digests: list[str] = []

    def _hashed(source: object) -> object:
        digest = RecordDigest()
        for batch in source:  # type: ignore[attr-defined]
            digest.add(batch)
            yield batch
            digest.done_reading()
        digests.append(digest.sha256)

    by_runs, one_by_one = batches(image_key), batches(None)
    assert by_runs == one_by_one
    assert len(by_runs) == -(-299 // batch_size)
    records = [pair for batch in by_runs for pair in batch]
    assert [key for key, _ in records] == [image_key(e) for e in listed if e.line != 100]
    whole = hashlib.sha256(b"".join(_framed(k, v) for k, v in records)).hexdigest()
    assert digests == [whole, whole]
