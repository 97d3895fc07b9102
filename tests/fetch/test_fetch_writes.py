"""fetch: a local write failure (file size limit, full disk) is "cannot write FILE" and stops.

A local write failure from a directory or file:// mirror stops at once: it was reported as the mirror's fault
("cannot read: File too large") and the next mirror was tried. Real limits only: RLIMIT_FSIZE
in a child process, a small tmpfs when root can mount one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from os_helpers import mounted_tmpfs
from test_fetch import Server, gz, small_files, start_server

from mnist2db.fetch.catalog import FILE_NAMES

# The child replaces the table's mnist entry by the test's files (as the monkeypatched
# tests do in-process), lowers its file size limit, then runs the real command line.
CHILD = """
import json, resource, sys
from mnist2db.fetch.catalog import DATASETS, Dataset, Resource
cfg = json.loads(sys.argv[1])
DATASETS["mnist"] = Dataset(
    "mnist", (), tuple(Resource(n, gz={"sha256": d}) for n, d in cfg["digests"].items())
)
if cfg["limit"]:
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["limit"], cfg["limit"]))
from mnist2db.cli.app import main
sys.argv = ["mnist2db", "fetch", "--data", cfg["data"], "--retries", "0", "--timeout", "5"]
for mirror in cfg["mirrors"]:
    sys.argv += ["--mirror", mirror]
main()
"""


def run_child(
    data: Path, mirrors: list[str], packed: dict[str, bytes], limit: int = 0
) -> subprocess.CompletedProcess[str]:
    import hashlib

    cfg = {
        "data": str(data),
        "mirrors": mirrors,
        "limit": limit,
        "digests": {n: hashlib.sha256(b).hexdigest() for n, b in packed.items()},
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, dict[str, bytes], dict[str, bytes]]:
    raw = small_files()
    packed = gz(raw)
    directory = tmp_path / "cache"
    directory.mkdir()
    for name, data in packed.items():
        (directory / f"{name}.gz").write_bytes(data)
    return directory, raw, packed


@pytest.mark.parametrize("as_url", [False, True], ids=["directory", "file-url"])
def test_file_size_limit_is_a_write_failure_not_the_mirrors(
    cache: tuple[Path, dict[str, bytes], dict[str, bytes]],
    server: Server,
    tmp_path: Path,
    as_url: bool,
) -> None:
    directory, raw, packed = cache
    server.serve("next", packed)
    data = tmp_path / "data"
    mirror = directory.as_uri() if as_url else str(directory)
    # Every file of 30 images (23 kB unpacked) is over the limit; the labels (38 B) are not.
    result = run_child(data, [mirror, server.url("next")], packed, limit=10_000)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"Error: {data / 'train-images-idx3-ubyte'}: cannot write: File too large\n"
    )
    assert server.count() == 0  # stopped: the next mirror was not tried
    assert not data.exists()  # no temporary left
    # The same command without the limit works: the mirror was fine.
    result = run_child(data, [mirror, server.url("next")], packed)
    assert result.returncode == 0, result.stderr
    assert server.count() == 0
    for name in FILE_NAMES:
        assert (data / name).read_bytes() == raw[name]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only): a real full disk."""
    with mounted_tmpfs(tmp_path / "tmpfs", "64k") as mount:
        yield mount


def test_full_disk_is_a_write_failure_not_the_mirrors(small_tmpfs: Path, tmp_path: Path) -> None:
    # Images of 40 000 × 28 × 28 zeros: 31 MB unpacked, a few kB packed, on a 64 KiB disk.
    import numpy as np
    from helpers import idx_bytes

    big = idx_bytes(np.zeros((40_000, 28, 28), dtype=np.uint8))
    raw = dict(small_files())
    raw["train-images-idx3-ubyte"] = big
    packed = gz(raw)
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, body in packed.items():
        (cache / f"{name}.gz").write_bytes(body)
    for state in start_server():
        state.serve("next", packed)
        data = small_tmpfs / "data"
        result = run_child(data, [cache.as_uri(), state.url("next")], packed)
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"Error: {data / 'train-images-idx3-ubyte'}: cannot write: No space left on device\n"
        )
        assert state.count() == 0
    assert not data.exists()  # made by the run: removed
