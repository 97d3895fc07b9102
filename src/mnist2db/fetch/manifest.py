"""The record of verified files: ``.mnist2db.sha256`` in each data directory.

It holds the sha256 of the files ``fetch`` placed, in ``sha256sum`` format, so that files
whose dataset publishes no unpacked digest (KMNIST, EMNIST's members) are still recognised
as verified. Its first line names the dataset: a file recorded for one dataset must not
pass as verified for another fetched into the same directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO

from mnist2db.errors import DownloadError
from mnist2db.fetch.sink import (
    IDX_HEAD_MAX,
    MAX_UNPACKED,
    STRENGTH,
    declared_size,
    handle_digests,
    strongest,
)
from mnist2db.storage.files import AtomicFile
from mnist2db.untrusted import NotRegularFile, open_regular

MANIFEST_NAME = ".mnist2db.sha256"
#: A manifest holds a header and one 66-byte line per file: a few hundred bytes.
MANIFEST_MAX = 64 << 10
_NOT_OURS = "not a manifest mnist2db wrote (remove it)"


def _header(dataset: str) -> str:
    # A comment line (sha256sum -c skips it) binding the entries to one dataset.
    return f"# mnist2db dataset: {dataset}\n"


def read_manifest(directory: str, dataset: str) -> dict[str, str]:
    """File name → sha256 recorded for ``dataset`` in ``directory`` (empty if none).

    Only a regular file of at most :data:`MANIFEST_MAX` bytes is read, opened without
    blocking (a FIFO there would hang the fetch; a link to ``/dev/zero`` never ends).

    Raises:
        DownloadError: something else is there under the manifest's name (not removed:
            mnist2db did not write it).
    """
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        handle = open_regular(path)
    except NotRegularFile as exc:
        raise DownloadError(f"{path}: {exc.strerror}; {_NOT_OURS}") from None
    except OSError:
        return {}  # none, or unreadable: files are checked against published digests
    with handle:
        try:
            data = handle.read(MANIFEST_MAX + 1)
        except OSError:
            return {}
    if len(data) > MANIFEST_MAX:
        raise DownloadError(f"{path}: larger than {MANIFEST_MAX} bytes; {_NOT_OURS}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {}
    lines = text.splitlines(keepends=True)
    if not lines or lines[0] != _header(dataset):
        return {}  # another dataset's (or an unknown) manifest vouches for nothing here
    entries: dict[str, str] = {}
    for line in lines[1:]:
        digest, _, name = line.rstrip("\n").partition("  ")
        if len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest) and name:
            entries[name] = digest.lower()
    return entries


def write_manifest(directory: str, dataset: str, entries: Mapping[str, str]) -> None:
    """Replace the manifest atomically. Raises ``OSError`` when it cannot be written."""
    lines = [_header(dataset)] + [f"{entries[n]}  {n}\n" for n in sorted(entries)]
    with AtomicFile(os.path.join(directory, MANIFEST_NAME)) as target:
        target.stream.write("".join(lines).encode("utf-8"))
        target.commit()


def verified_present(
    path: str,
    published: Mapping[str, str],
    recorded: str | None,
    kind: str = "",
    *,
    idx: bool = False,
    size: int | None = None,
    limit: int = MAX_UNPACKED,
) -> str | None:
    """How the file at ``path`` is verified, or None (missing, not a regular file, or not
    matching).

    Its size is checked before anything is hashed (a sparse file of 200 GB would take
    minutes): ``size`` exactly when given, else at most ``limit``, and for an ``idx`` file
    what its header declares.
    """
    try:
        handle = open_regular(path)
    except OSError:
        return None
    with handle:
        try:
            actual = os.fstat(handle.fileno()).st_size
            if (size is not None and actual != size) or actual > limit:
                return None
            if idx:
                if declared_size(handle.read(IDX_HEAD_MAX)) != actual:
                    return None
                handle.seek(0)
            return verify_handle(handle, path, published, recorded, kind)
        except (OSError, ValueError):  # a read error; not an IDX header
            return None


def verify_handle(
    handle: IO[bytes], path: str, published: Mapping[str, str], recorded: str | None, kind: str = ""
) -> str | None:
    """How what ``handle`` holds (from its position to its end) is verified, or None.

    Where digests are published, they decide (all of them must match; the strongest is
    named); the sha256 ``recorded`` in the manifest speaks only where nothing is published.
    ``kind`` labels the digest in the answer; default ``.gz`` for a ``.gz`` file (by
    ``path``), else ``unpacked``.

    Raises:
        OSError: a read error.
    """
    digests = handle_digests(handle, ["sha256", *published])
    kind = kind or (".gz" if path.endswith(".gz") else "unpacked")
    if published:
        if all(digests.get(a) == d.lower() for a, d in published.items()):
            return f"{kind} {STRENGTH[strongest(published)]}"
        return None
    if recorded is not None and digests["sha256"] == recorded:
        return f"{kind} sha256 recorded when fetched"
    return None
