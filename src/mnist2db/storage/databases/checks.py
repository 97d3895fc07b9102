"""Checks before a backend opens a database: LMDB's pages, LevelDB's ``CURRENT`` and ``LOCK``.

LMDB maps ``data.mdb`` and trusts it: an empty file makes a read-only open fail with "Bad
file descriptor" (LMDB takes it for a new database and cannot write one), a file cut short
after its meta pages ends the process with SIGBUS on the first read past its end, garbage
gives "MDB_INVALID", and a damaged page past the meta pages aborts or crashes the process
on the first read that reaches it (:mod:`mnist2db.storage.databases.lmdb_pages` walks them).
LevelDB creates ``LOCK`` and ``LOG`` in the directory before it reads ``CURRENT``, so a
directory that is no LevelDB database is changed by the attempt. Both are checked here
first, through the database directory's descriptor, reading and writing nothing else;
the messages name the file and what is wrong with it.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import struct

from mnist2db.errors import BackendError
from mnist2db.storage.databases.lmdb_pages import MainDb, check_pages

# LMDB's meta pages (liblmdb mdb.c: MDB_page, MDB_meta, mdb_env_read_header). Pages 0 and 1
# each hold a meta page: a page header (mp_pgno: a size_t; mp_pad, mp_flags, and two
# 16-bit bounds), then MDB_meta: mm_magic, mm_version (32 bits each), mm_address,
# mm_mapsize, mm_dbs[2] (48 bytes each, the first one's md_pad is the page size),
# mm_last_pg, mm_txnid: C's layout, in the writing machine's byte order and word size, as
# LMDB reads it (native here too).
_WORD = struct.calcsize("N")  # size_t, pgno_t and txnid_t
_PAGE_HEADER = _WORD + 8  # PAGEHDRSZ
_META_AT = _PAGE_HEADER
# MDB_meta: magic, version, address, map size, the free and the main MDB_db (md_pad,
# md_flags, md_depth, then branch, leaf and overflow pages, entries, root), last page, txnid.
_META = struct.Struct("@IINN" + "IHH5N" * 2 + "NN")
#: Bytes of one meta page LMDB reads (sizeof(MDB_metabuf)): the header and MDB_meta.
LMDB_META_BYTES = _PAGE_HEADER + _META.size
_FLAGS = struct.Struct("=H")
_FLAGS_AT = _WORD + 2
_P_META = 0x08
#: MDB_MAGIC, and MDB_DATA_VERSION of LMDB 0.9 (what py-lmdb bundles).
LMDB_MAGIC = 0xBEEFC0DE
LMDB_DATA_VERSION = 1
_SWAPPED_MAGIC = 0xDEC0EFBE

#: What a LevelDB ``CURRENT`` holds: the name of the manifest in use, and a newline.
_CURRENT = re.compile(rb"(MANIFEST-[0-9]+)\n")
_CURRENT_LIMIT = 4096


def _open(dir_fd: int, name: str) -> int | None:
    """``name`` in ``dir_fd`` opened to read, or None where the backend's own open should
    say what is wrong (missing files are told by the callers)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None  # said by ReadHandle.check_files
    return fd


def _read_at(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def check_lmdb_file(path: str, dir_fd: int) -> None:
    """Raise unless ``data.mdb`` in the directory ``dir_fd`` (the database ``path``) starts
    with LMDB's two meta pages and is as long as the newer of them says.

    Raises:
        BackendError: the file is missing, empty, shorter than its meta pages or than the
            pages they record, holds no LMDB magic, or is of another LMDB data version.
    """
    name = os.path.join(path, "data.mdb")
    try:
        fd = _open(dir_fd, "data.mdb")
    except FileNotFoundError:
        raise BackendError(f"{name}: no such file: not an LMDB database") from None
    if fd is None:
        return
    try:
        size = os.fstat(fd).st_size
        first = _read_at(fd, LMDB_META_BYTES, 0)
        if size == 0:
            raise BackendError(f"{name}: empty (0 bytes): not an LMDB database")
        if len(first) < LMDB_META_BYTES:
            raise BackendError(
                f"{name}: {size} bytes, shorter than LMDB's two meta pages: "
                "not an LMDB database (or one cut short)"
            )
        fields = _meta(name, first, 0)
        page, txnid = fields[4], fields[-1]
        if page & (page - 1) or not 512 <= page <= 65536:
            raise BackendError(
                f"{name}: page size {page} in its first meta page is not a power of two "
                "from 512 to 65536: a damaged LMDB database"
            )
        if size < 2 * page:
            raise BackendError(
                f"{name}: {size} bytes, shorter than LMDB's two meta pages "
                f"({2 * page} bytes): a truncated LMDB database"
            )
        second = _read_at(fd, LMDB_META_BYTES, page)
        fields_1 = _meta(name, second, page)
        if fields_1[4] != page:
            raise BackendError(
                f"{name}: its meta pages record page sizes {page} and {fields_1[4]}: a "
                "damaged LMDB database"
            )
        if fields_1[-1] > txnid:  # liblmdb reads the newer one
            fields = fields_1
        main = MainDb(page, fields[20], *fields[13:20])
        last_page = main.last_page
        needed = (last_page + 1) * page
        if size < needed:
            raise BackendError(
                f"{name}: {size} bytes, shorter than the {last_page + 1} pages of {page} "
                f"bytes its meta page records ({needed} bytes): a truncated LMDB database"
            )
        check_pages(name, fd, main)
    except OSError as exc:
        raise BackendError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _meta(name: str, page: bytes, offset: int) -> tuple[int, ...]:
    """The fields of the meta page at ``offset`` (its first :data:`LMDB_META_BYTES`
    bytes; :data:`_META`'s, the free database's md_pad being the page size), checked as
    LMDB checks them."""
    (flags,) = _FLAGS.unpack_from(page, _FLAGS_AT)
    fields = _META.unpack_from(page, _META_AT)
    magic, version = fields[:2]
    where = "" if offset == 0 else f" at byte {offset} (its second meta page)"
    if magic == _SWAPPED_MAGIC:
        raise BackendError(
            f"{name}: an LMDB data file of the other byte order: LMDB files are not "
            "portable between byte orders"
        )
    if magic != LMDB_MAGIC or not flags & _P_META:
        if offset == 0:
            raise BackendError(f"{name}: not an LMDB data file (no LMDB magic)")
        raise BackendError(f"{name}: no LMDB meta page{where}: a damaged LMDB database")
    if version != LMDB_DATA_VERSION:
        raise BackendError(
            f"{name}: LMDB data version {version}{where}, expected {LMDB_DATA_VERSION}"
        )
    return fields


def check_leveldb_current(path: str, dir_fd: int) -> None:
    """Raise unless ``CURRENT`` in the directory ``dir_fd`` (the database ``path``) names a
    manifest that is there and not empty: LevelDB would write its ``LOCK`` and ``LOG`` in
    the directory before finding out.

    Raises:
        BackendError: ``CURRENT`` is missing, empty or names no manifest, or the manifest is
            missing or empty.
    """
    name = os.path.join(path, "CURRENT")
    try:
        fd = _open(dir_fd, "CURRENT")
    except FileNotFoundError:
        raise BackendError(f"{name}: no such file: not a LevelDB database") from None
    if fd is None:
        return
    try:
        text = _read_at(fd, _CURRENT_LIMIT, 0)
    except OSError as exc:
        raise BackendError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if not text:
        raise BackendError(f"{name}: empty (0 bytes): not a LevelDB database")
    found = _CURRENT.fullmatch(text)
    if found is None:
        shown = text[:40] + (b"..." if len(text) > 40 else b"")
        raise BackendError(
            f"{name}: does not name a LevelDB manifest (it holds {shown!r}, expected "
            "MANIFEST-<number> and a newline): not a LevelDB database"
        )
    manifest = found.group(1).decode("ascii")
    try:
        size = os.stat(manifest, dir_fd=dir_fd).st_size
    except FileNotFoundError:
        raise BackendError(
            f"{os.path.join(path, manifest)}: no such file (CURRENT names it): a LevelDB "
            "database without its manifest"
        ) from None
    except OSError:
        return  # LevelDB's own open says what is wrong
    if size == 0:
        raise BackendError(
            f"{os.path.join(path, manifest)}: empty (0 bytes): a damaged LevelDB database"
        )


# LevelDB's log (db/log_format.h): 32 KiB blocks of records, each a 7-byte header (CRC32C,
# a 16-bit length, a type: FULL, or FIRST, MIDDLE..., LAST for a record split across
# blocks) and its bytes; fewer than 7 bytes left in a block are a zero trailer.
_LOG_BLOCK = 32768
_LOG_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_LOG_NAME = re.compile(r"[0-9]+\.log", re.ASCII)


def check_leveldb_logs(path: str, dir_fd: int) -> None:
    """Raise unless each log of the LevelDB database ``path`` (directory ``dir_fd``) is
    framed whole: where a log ends inside a record or a record's header is zeroed,
    LevelDB's recovery takes the rest for a write cut short by a crash and drops it in
    silence, paranoid checks or not, then writes what is left into a table and deletes
    the log. Checksums are LevelDB's own to check (paranoid checks, on opening).

    Raises:
        BackendError: a log ends inside a record or its header, holds a zeroed record
            header, or a record running past its block.
    """
    try:
        names = [entry.name for entry in os.scandir(dir_fd) if _LOG_NAME.fullmatch(entry.name)]
    except OSError:
        return  # LevelDB's own open says what is wrong
    for log in names:
        try:
            fd = _open(dir_fd, log)
        except FileNotFoundError:
            continue
        if fd is None:
            continue
        try:
            problem = _log_problem(fd, os.fstat(fd).st_size)
        except OSError as exc:
            problem = f"cannot read it: {exc.strerror or exc}"
        finally:
            os.close(fd)
        if problem is not None:
            raise BackendError(
                f"{os.path.join(path, log)}: {problem}: a damaged LevelDB log (LevelDB would "
                "drop the records after it in silence); its files were left as they were"
            )


def _log_problem(fd: int, size: int) -> str | None:
    """What is wrong with the framing of the log open as ``fd``, or None."""
    fragmented = False
    offset = 0
    while offset < size:
        block = _read_at(fd, _LOG_BLOCK, offset)
        if not block:
            return f"ends at byte {offset}, before its {size} bytes (cut short while read?)"
        at = 0
        while len(block) - at >= _LOG_HEADER:
            length = block[at + 4] | block[at + 5] << 8
            kind = block[at + 6]
            where = offset + at
            if kind == 0 and length == 0:
                return f"a zeroed record header at byte {where}"
            if at + _LOG_HEADER + length > len(block):
                if offset + len(block) >= size:
                    return f"ends inside the record at byte {where} ({length} bytes long)"
                return f"the record at byte {where} ({length} bytes) runs past its block"
            if kind in (_FIRST, _FULL):
                fragmented = kind == _FIRST
            elif kind == _LAST:
                fragmented = False
            at += _LOG_HEADER + length
        if offset + len(block) >= size and at < len(block):
            return f"ends inside a record header at byte {offset + at}"
        offset += len(block)
    if fragmented:
        return "ends inside a record split across blocks (its last part is missing)"
    return None


def leveldb_lock_holder(dir_fd: int) -> int | None:
    """The pid holding LevelDB's lock (a POSIX record lock on ``LOCK``) in the directory
    ``dir_fd``, or None. Asked with an open file description lock, which conflicts with
    every record lock, this process's own included (where the system has them)."""
    query = getattr(fcntl, "F_OFD_GETLK", None)
    if query is None:
        return None
    try:
        fd = os.open("LOCK", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError:
        return None
    layout = "hhqqi4x"  # struct flock: type, whence, start, len, pid (Linux, 64-bit off_t)
    try:
        answer = fcntl.fcntl(fd, query, struct.pack(layout, fcntl.F_WRLCK, 0, 0, 0, 0))
        kind, _, _, _, pid = struct.unpack(layout, answer)
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    return None if kind == fcntl.F_UNLCK or pid <= 0 else int(pid)
