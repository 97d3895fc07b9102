"""The resumable digest: OpenSSL's SHA-256 state saved and restored gives hashlib's digest at
every split; a resumed run's digest is taken only from the state saved at the staged
database's record count and last key; owner detection reads the process's state and start."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnist2db.storage.digest_state import (
    STATE_FILE,
    SavableSha256,
    StateFile,
    libcrypto,
    resumable_digest,
    resumed_digest,
    saved_count,
)
from mnist2db.storage.owners import pid_alive, process_start
from mnist2db.storage.record_digest import RecordDigest

needs_libcrypto = pytest.mark.skipif(libcrypto() is None, reason="no libcrypto to load")


@needs_libcrypto
@settings(max_examples=200)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_a_saved_and_restored_state_gives_hashlibs_digest(data: bytes, cuts: list[int]) -> None:
    hasher = SavableSha256(libcrypto())
    start = 0
    for cut in sorted(cuts):
        hasher.update(bytearray(data[start:cut]) if cut % 2 else data[start:cut])
        restored = SavableSha256.restored(libcrypto(), hasher.state())
        assert restored is not None
        hasher, start = restored, max(start, cut)
    hasher.update(memoryview(data[start:]))
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()


def batches(n: int, start: int = 0) -> list[list[tuple[bytes, bytes]]]:
    return [
        [(b"%08d" % i, os.urandom(i % 50) * (1 + (i % 3) * 400)) for i in range(s, s + 7)]
        for s in range(start, start + 7 * n, 7)
    ]


@needs_libcrypto
def test_a_resumed_digest_continues_from_the_state_of_the_committed_records(
    tmp_path: Path,
) -> None:
    work = batches(6)
    whole = RecordDigest()
    for batch in work:
        whole.add(batch)
    digest = resumable_digest()
    states = StateFile(str(tmp_path), digest)
    for batch in work[:4]:
        digest.add(batch)
        states.save()
    digest.close()
    saved = json.loads((tmp_path / STATE_FILE).read_text())["states"]
    assert [s["records"] for s in saved] == [21, 28]  # the last two commits'
    assert saved_count(str(tmp_path), work[3][-1][0]) == 28
    # The state of 3 batches (a kill after the 4th was saved, before it committed) or of 4.
    for done in (3, 4):
        again = resumed_digest(str(tmp_path), 7 * done, work[done - 1][-1][0])
        assert again is not None and again.count == 7 * done
        for batch in work[done:]:
            again.add(batch)
        assert again.fields() == whole.fields()
        again.close()
    assert resumed_digest(str(tmp_path), 14, work[1][-1][0]) is None  # not saved: none
    assert resumed_digest(str(tmp_path), 28, b"00000099") is None  # another last key
    whole.close()


def test_a_zombie_or_a_process_started_at_another_time_is_no_owner() -> None:
    me = process_start(os.getpid())
    if me is None:
        pytest.skip("no /proc")
    assert pid_alive(os.getpid()) and pid_alive(os.getpid(), me)
    assert not pid_alive(os.getpid(), me + 1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not pid_alive(child.pid)
    child.wait()
