"""The workers' rings of shared memory (mnist2db.imageset.workers.result_ring), with real forked
processes: records put by a child are read by the parent as they were put; a full ring
refuses until space is released; every span a worker could not have written is refused; a
worker that dies in the middle of a record, or announces one outside its ring, costs its
own image only (through mnist2db.imageset.workers.pool, with real processes)."""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import sys
import warnings

import pytest

from mnist2db.formats.lists.image_list import ListEntry
from mnist2db.imageset.workers import loop as worker_loop
from mnist2db.imageset.workers import pool as workers
from mnist2db.imageset.workers.messages import ResultMessage, send_message
from mnist2db.imageset.workers.pool import OrderedDecoding, decode_in_order
from mnist2db.imageset.workers.result_ring import ResultRing, RingError

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="the rings are mapped before a fork"
)


def _in_child(ring: ResultRing, records: list[bytes]) -> list[tuple[int, int] | None]:
    """``records`` put into ``ring`` by a forked child; the spans it announced."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork beside threads
        pid = os.fork()
    if pid == 0:  # the child: put, announce, leave at once
        os.close(read)
        spans = [ring.put(record) for record in records]
        os.write(write, pickle.dumps(spans))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        spans = pickle.loads(pipe.read())
    os.waitpid(pid, 0)
    return spans


def test_records_put_by_a_child_are_read_as_they_were_put() -> None:
    ring = ResultRing(1 << 16)
    records = [bytes([i]) * (1000 + 37 * i) for i in range(12)]
    spans = _in_child(ring, records)
    assert all(span is not None for span in spans)
    assert [bytes(ring.view(*span)) for span in spans if span] == records


def test_a_full_ring_refuses_until_space_is_released_and_never_splits_a_record() -> None:
    ring = ResultRing(1 << 16)  # records of a quarter at most: 16 KiB
    first = _in_child(ring, [b"a" * 15000] * 5)
    assert first[:4] == [(0, 15000), (15000, 15000), (30000, 15000), (45000, 15000)]
    assert first[4] is None  # 60000 + 15000 > 65536: no room (and no wrap over unreleased)
    views = [ring.view(*span) for span in first[:4] if span]
    # The child's next record starts where its last ended (a fresh child: the parent's count)
    ring._written = 60000  # what the worker that put them knows
    ring.release(30000)  # two records written: their space is the worker's again
    second = _in_child(ring, [b"b" * 15000, b"c" * 16384])
    # 60000 + 15000 would cross the end: the tail is skipped, the record starts the ring
    # again; the next would reach the records not released
    assert second == [(65536, 15000), None]
    assert bytes(ring.view(65536, 15000)) == b"b" * 15000
    # The two records not released are as they were.
    assert bytes(views[2]) == bytes(views[3]) == b"a" * 15000
    assert _in_child(ResultRing(1 << 16), [b"x" * (16385)]) == [None]  # over a quarter


@pytest.mark.parametrize(
    "span",
    [
        (-1, 10),  # before the ring began
        (0, -1),  # a negative length
        (65530, 100),  # over the ring's end
        (1 << 40, 10),  # far beyond what was released
        (100, 65536),  # the whole ring and more, over unreleased space
        ("0", 10),  # not numbers
        (0.0, 10),
        (True, 10),
    ],
)
def test_a_span_the_worker_could_not_have_written_is_refused(span: tuple[object, object]) -> None:
    ring = ResultRing(1 << 16)
    with pytest.raises(RingError, match="outside its ring"):
        ring.view(*span)


def test_a_span_before_one_already_taken_or_over_space_not_released_is_refused() -> None:
    ring = ResultRing(1 << 16)
    spans = _in_child(ring, [b"r" * 10000] * 3)
    views = [ring.view(*span) for span in spans if span]
    assert [bytes(v) for v in views] == [b"r" * 10000] * 3
    with pytest.raises(RingError):
        ring.view(0, 10000)  # taken already: announced twice
    with pytest.raises(RingError):
        ring.view(65536, 10000)  # the ring's start again: over the first record, not released
    ring.release(10000)
    assert len(ring.view(65536, 10000)) == 10000  # now it is the worker's


def test_a_garbage_released_count_is_taken_for_no_space() -> None:
    ring = ResultRing(1 << 16)
    ring._map[:8] = struct.pack("=Q", 1 << 50)  # a count the parent never wrote
    assert _in_child(ring, [b"z" * 100]) == [None]


class Work:
    """Records of 100 KiB (they travel in the ring) whose bytes name the line; ``torn``:
    writes half a record into the worker's ring without announcing it, and dies by SIGKILL;
    ``liar``: announces a record outside its ring (a message forged on the worker's own
    pipe), and goes on."""

    def __call__(self, entry: ListEntry) -> object:
        name = entry.path.decode()
        if name in ("torn", "liar"):
            serve = sys._getframe()
            while serve.f_code is not worker_loop.serve.__code__:
                serve = serve.f_back  # type: ignore[assignment]
            ring, out = serve.f_locals["ring"], serve.f_locals["out"]
            if name == "torn":
                at = min(ring._written % ring.size, ring.size - 50000)
                ring._data[at : at + 50000] = b"\xee" * 50000
                os.kill(os.getpid(), signal.SIGKILL)
            message = ResultMessage(None)
            message.sizes.append((ring._written + (1 << 40), 100))
            message.rest.append(((3, 1, 1),))
            send_message(out, message.parts())
        return (b"%08d" % entry.line * (12800), (3, 1, 1))


def _expected(line: int) -> bytes:
    return b"%08d" % line * 12800


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_killed_in_the_middle_of_a_record_costs_its_image_only(jobs: int) -> None:
    names = [f"image{i}" for i in range(60)]
    names[7] = names[40] = "torn"
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]
    got = [
        (e, r if isinstance(r, str) else bytes(r[0]))
        for e, r in decode_in_order(listed, Work(), b"r/", jobs)
    ]
    assert [entry for entry, _ in got] == listed
    for line in (7, 40):
        assert got[line][1] == "r/torn: cannot read it: its decoder died (SIGKILL)"
    assert [r for i, (_, r) in enumerate(got) if i not in (7, 40)] == [
        _expected(i) for i in range(60) if i not in (7, 40)
    ]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_that_announces_a_record_outside_its_ring_costs_its_image_only(jobs: int) -> None:
    names = [f"image{i}" for i in range(50)]
    names[3] = names[33] = "liar"
    listed = [ListEntry(i, name.encode(), 0) for i, name in enumerate(names)]
    got = [
        (e, r if isinstance(r, str) else bytes(r[0]))
        for e, r in decode_in_order(listed, Work(), b"", jobs)
    ]
    for line in (3, 33):
        assert (
            got[line][1]
            == "liar: cannot read it: its decoder sent a result that is not one (killed)"
        )
    assert [r for i, (_, r) in enumerate(got) if i not in (3, 33)] == [
        _expected(i) for i in range(50) if i not in (3, 33)
    ]


@pytest.mark.parametrize("release", [True, False])
def test_records_stay_as_yielded_until_released_and_the_ring_is_reused_after(
    release: bool,
) -> None:
    """1,200 records of 100 KiB (120 MB, the rings 8 MiB each): without release(), the
    rings fill once and the rest come by the pipes, and every record is intact when read
    again at the end; with it after each record, the rings are used again and again."""
    count = 1200
    listed = [ListEntry(i, b"image%d" % i, 0) for i in range(count)]
    kept = []
    in_rings = 0
    with OrderedDecoding(listed, Work(), b"", 2, preload=None) as decoding:
        for entry, (record, _) in decoding:
            assert bytes(record) == _expected(entry.line)
            in_rings += isinstance(record.obj, mmap.mmap)
            if release:
                decoding.release()
            else:
                kept.append((entry.line, record))
    ring_records = (workers.RING_BYTES // (100 << 10)) * 2  # what the two rings hold once
    if release:
        assert in_rings > ring_records
    else:
        assert 0 < in_rings <= ring_records
        assert all(bytes(record) == _expected(line) for line, record in kept)


def test_a_caller_that_promises_releases_and_makes_none_still_gets_every_record() -> None:
    """``releases=True`` makes a worker whose ring is full wait for space, a little: never
    released, the rings fill, and the rest come by the pipes after each wait, intact."""
    count = 200  # the two rings hold 162 of them
    listed = [ListEntry(i, b"image%d" % i, 0) for i in range(count)]
    kept = []
    with OrderedDecoding(listed, Work(), b"", 2, preload=None, releases=True) as decoding:
        kept = [(entry.line, record) for entry, (record, _) in decoding]
    assert [line for line, _ in kept] == list(range(count))
    assert all(bytes(record) == _expected(line) for line, record in kept)
    assert 0 < sum(isinstance(record.obj, mmap.mmap) for _, record in kept) <= 162


def test_a_worker_waits_for_released_space_when_patient() -> None:
    """A full ring with patience: the child's put returns the span once the parent releases
    space after the fork (whenever the release comes in the child's wait); without patience
    the same full ring refuses at once."""
    ring = ResultRing(1 << 16, patience=30.0)
    spans = _in_child(ring, [b"p" * 16000] * 4)
    assert None not in spans
    for span in spans:
        ring.view(*span)  # type: ignore[misc]
    ring._written = 64000  # the worker's count after its four records
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, pickle.dumps(ring.put(b"q" * 16000)))
        os._exit(0)
    os.close(write)
    ring.release(16000)
    with os.fdopen(read, "rb") as pipe:
        assert pickle.loads(pipe.read()) == (65536, 16000)
    os.waitpid(pid, 0)
    impatient = ResultRing(1 << 16)
    impatient._written = 64000
    assert _in_child(impatient, [b"q" * 16000]) == [None]
