"""The records' digest of a resumable run, saved at each commit and continued by
``--resume`` without reading a committed record again.

hashlib's objects cannot be saved, so a resumable run hashes with OpenSSL's own
``SHA256_CTX`` (the libcrypto hashlib itself uses, through ctypes): the same SHA-256, the
same digest (:data:`~mnist2db.storage.record_digest.DIGEST_METHOD`), and a state of 112
bytes. Before each batch is committed, the state after it is written beside the plan
(:data:`STATE_FILE`) with the one before it: a kill before or after the commit leaves the
state of the records committed. A resume takes the state whose record count and last key
are the staged database's. Where libcrypto cannot be loaded, a resume reads the committed
records again (:func:`mnist2db.conversion.write_database`).
"""

from __future__ import annotations

import _hashlib  # noqa: F401  (loads the libcrypto hashlib links: found in the maps)
import contextlib
import ctypes
import hashlib
import json
import os
import stat

from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.storage.record_digest import RecordDigest

if TYPE_CHECKING:
    from typing import Any

#: The saved states in a staging directory (removed with the plan, before placement).
STATE_FILE = "mnist2db-digest-state.json"
#: ``SHA256_CTX`` (openssl/sha.h): ``h[8], Nl, Nh, data[16], num, md_len``, 32 bits each.
_CTX_SIZE = 112
_STATE_LIMIT = 1 << 16


class SavableSha256:
    """SHA-256 over OpenSSL's ``SHA256_CTX``: ``update``, ``hexdigest`` as hashlib's, and
    ``state()``, the bytes that :meth:`restored` continues from."""

    def __init__(self, library: Any, state: bytes | None = None) -> None:
        self._lib = library
        self._ctx = ctypes.create_string_buffer(_CTX_SIZE)
        if state is None:
            library.SHA256_Init(self._ctx)
        else:
            ctypes.memmove(self._ctx, state, _CTX_SIZE)

    def update(self, data: Any) -> None:
        if isinstance(data, bytes):
            self._lib.SHA256_Update(self._ctx, data, len(data))
            return
        view = memoryview(data).cast("B")
        if view.readonly:  # a view of bytes elsewhere: copied (writable buffers are not)
            self._lib.SHA256_Update(self._ctx, bytes(view), len(view))
            return
        array = (ctypes.c_char * len(view)).from_buffer(view)
        try:
            self._lib.SHA256_Update(self._ctx, array, len(view))
        finally:
            del array
            view.release()

    def state(self) -> bytes:
        return self._ctx.raw

    def hexdigest(self) -> str:
        ctx = ctypes.create_string_buffer(self._ctx.raw, _CTX_SIZE)  # the state goes on
        out = ctypes.create_string_buffer(32)
        self._lib.SHA256_Final(out, ctx)
        return out.raw.hex()

    @classmethod
    def restored(cls, library: Any, state: bytes) -> SavableSha256 | None:
        """The hash continued from ``state``; None if it is not one (its block count)."""
        if len(state) != _CTX_SIZE:
            return None
        num = int.from_bytes(state[104:108], "little")
        md_len = int.from_bytes(state[108:112], "little")
        return cls(library, state) if num < 64 and md_len == 32 else None


_LIBRARY: list[Any] = []


def libcrypto() -> Any:
    """OpenSSL's libcrypto as hashlib loaded it, checked against hashlib; None if absent."""
    if _LIBRARY:
        return _LIBRARY[0]
    library = None
    try:
        library = _load()
    except (OSError, AttributeError, ImportError, ValueError):
        library = None
    _LIBRARY.append(library)
    return library


def _load() -> Any:
    names = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "libcrypto" in os.path.basename(path) and path not in names:
                    names.append(path)
    except OSError:
        pass
    names += ["libcrypto.so.3", "libcrypto.3.dylib", "libcrypto-3-x64.dll", "libcrypto-3.dll"]
    for name in names:
        try:
            library = ctypes.CDLL(name)
            init, update, final = library.SHA256_Init, library.SHA256_Update, library.SHA256_Final
        except (OSError, AttributeError):
            continue
        init.argtypes = (ctypes.c_void_p,)
        update.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        final.argtypes = (ctypes.c_char_p, ctypes.c_void_p)
        # Proven on this process's library: a state saved and restored gives hashlib's digest.
        probe = SavableSha256(library)
        probe.update(b"mnist2db" * 9)
        again = SavableSha256.restored(library, probe.state())
        if again is None:
            continue
        again.update(bytearray(b"state" * 20))
        if again.hexdigest() == hashlib.sha256(b"mnist2db" * 9 + b"state" * 20).hexdigest():
            return library
    return None


def resumable_digest() -> RecordDigest:
    """A new digest whose state can be saved (hashlib's where libcrypto is absent)."""
    library = libcrypto()
    return RecordDigest(None if library is None else SavableSha256(library))


def saved_state(digest: RecordDigest) -> dict[str, Any] | None:
    """The digest's state once every batch added is hashed; None if it cannot be saved."""
    if not isinstance(digest.hasher, SavableSha256):
        return None
    digest.wait()
    return {
        "records": digest.count,
        "last_key_hex": None if digest.last is None else digest.last.hex(),
        "ordered": digest.ordered,
        "sha256_state": digest.hasher.state().hex(),
    }


class StateFile:
    """The states of the last two batches of a staged database, written before each commit
    (:meth:`save`, a writer's ``before_commit``)."""

    def __init__(self, staging: str, digest: RecordDigest) -> None:
        self.path = os.path.join(staging, STATE_FILE)
        self.digest = digest
        self._states: list[dict[str, Any]] = []
        first = saved_state(digest)
        if first is not None:
            self._states = [first]
            self._write()

    def save(self, batch: object = None) -> None:
        """Save the state after the batch just added (``batch``: it, unused)."""
        state = saved_state(self.digest)
        if state is None:
            return
        self._states = [*self._states[-1:], state]
        self._write()

    def _write(self) -> None:
        # Whole or absent after a kill (the commit that follows is not synced either).
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump({"states": self._states}, stream)
        os.replace(temporary, self.path)


def _saved_states(staging: str) -> list[Any]:
    # Read as a stranger's file: no link followed, never blocking on a FIFO, regular only.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        with open(os.open(os.path.join(staging, STATE_FILE), flags), "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return []
            states = json.loads(stream.read(_STATE_LIMIT))["states"]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return []
    return [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []


def saved_count(staging: str, last_key: bytes | None) -> int | None:
    """The record count saved with the state whose last key is ``last_key`` (None: none)."""
    if last_key is None:
        return 0
    for state in _saved_states(staging):
        records = state.get("records")
        if state.get("last_key_hex") == last_key.hex() and isinstance(records, int):
            return records
    return None


def resumed_digest(staging: str, records: int, last_key: bytes | None) -> RecordDigest | None:
    """The digest of the ``records`` records a staged database committed, the last of them
    ``last_key``, from the state saved at its commit; None if none was saved for it (a run
    of an earlier version, or where libcrypto is absent)."""
    library = libcrypto()
    if library is None:
        return None
    wanted = None if last_key is None else last_key.hex()
    for state in reversed(_saved_states(staging)):
        if state.get("records") != records or state.get("last_key_hex") != wanted:
            continue
        try:
            hasher = SavableSha256.restored(library, bytes.fromhex(state["sha256_state"]))
        except (KeyError, TypeError, ValueError):
            return None
        if hasher is None:
            return None
        digest = RecordDigest(hasher, records, last_key)
        if state.get("ordered") is False:
            digest.mark_unordered()
        return digest
    return None


def remove_saved_states(stagings: list[str]) -> None:
    """The saved states out of the staging directories, before they are placed."""
    for staging in stagings:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(staging, STATE_FILE))
