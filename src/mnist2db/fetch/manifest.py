"""The record of verified files: ``.mnist2db.sha256`` in each data directory.

It holds the sha256 of the files ``fetch`` placed, in ``sha256sum`` format, so that files
whose dataset publishes no unpacked digest (KMNIST, EMNIST's members) are still recognised
as verified. Its first line names the dataset: a file recorded for one dataset must not
pass as verified for another fetched into the same directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mnist2db.fetch.sink import file_digests
from mnist2db.storage.files import AtomicFile

MANIFEST_NAME = ".mnist2db.sha256"


def _header(dataset: str) -> str:
    # A comment line (sha256sum -c skips it) binding the entries to one dataset.
    return f"# mnist2db dataset: {dataset}\n"


def read_manifest(directory: str, dataset: str) -> dict[str, str]:
    """File name → sha256 recorded for ``dataset`` in ``directory`` (empty if none)."""
    entries: dict[str, str] = {}
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as handle:
            if handle.readline() != _header(dataset):
                return {}  # another dataset's (or an unknown) manifest vouches for nothing here
            for line in handle:
                digest, _, name = line.rstrip("\n").partition("  ")
                if len(digest) == 64 and name:
                    entries[name] = digest.lower()
    except (OSError, UnicodeDecodeError):
        pass  # no manifest, or an unreadable one: files are checked against published digests
    return entries


def write_manifest(directory: str, dataset: str, entries: Mapping[str, str]) -> None:
    """Replace the manifest atomically. Raises ``OSError`` when it cannot be written."""
    lines = [_header(dataset)] + [f"{entries[n]}  {n}\n" for n in sorted(entries)]
    with AtomicFile(os.path.join(directory, MANIFEST_NAME)) as target:
        target.stream.write("".join(lines).encode("utf-8"))
        target.commit()


def verified_present(
    path: str, published: Mapping[str, str], recorded: str | None, kind: str = ""
) -> str | None:
    """How the file at ``path`` is verified (published digest or manifest), or None.

    ``kind`` labels the digest in the answer; default ``.gz`` for a ``.gz`` file, else
    ``unpacked``.
    """
    if not os.path.isfile(path):
        return None
    digests = file_digests(path, ["sha256", *published])
    if digests is None:
        return None
    kind = kind or (".gz" if path.endswith(".gz") else "unpacked")
    for algorithm, expected in published.items():
        if digests.get(algorithm) == expected.lower():
            return f"{kind} {algorithm}"
    if recorded is not None and digests["sha256"] == recorded:
        return f"{kind} sha256 recorded when fetched"
    return None
