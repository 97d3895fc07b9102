"""A decoding worker's own side (the parent's: :mod:`mnist2db.images.workers`): its loop,
tasks in and messages of results out (:mod:`mnist2db.images.worker_messages`), until the
parent closes its end or dies; and :func:`attempt`, an entry's result or the reason it
could not be read."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection

from mnist2db.errors import ImageError, printable
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.image_list import ListEntry
from mnist2db.images.process_setup import WORKER_HEAP, keep_the_heap
from mnist2db.images.result_ring import ResultRing
from mnist2db.images.worker_messages import ResultMessage, send_message

if TYPE_CHECKING:
    from typing import Any

#: Bytes of results a worker gathers into one message (one image may exceed it alone).
MESSAGE_BYTES = 1 << 18

_PR_SET_PDEATHSIG = 1
_entry = tuple.__new__  # a ListEntry from its fields' tuple


def attempt(work: Callable[[ListEntry], Any], root: bytes, entry: ListEntry) -> Any:
    """``work(entry)``, or the reason (a str) the image could not be read."""
    try:
        return work(entry)
    except ImageError as exc:
        return str(exc)
    except OSError as exc:
        return f"{shown_entry(root, entry)}: cannot read it: {exc.strerror}"


def shown_entry(root: bytes, entry: ListEntry) -> str:
    """The image's path as messages show it."""
    return printable(os.fsdecode(root + entry.path))


def serve(
    tasks: Connection,
    conn: Connection,
    work: Callable[[ListEntry], Any],
    root: bytes,
    ring: ResultRing | None,
    keys: Callable[[ListEntry], bytes] | None = None,
    warm: Callable[[], None] | None = None,
) -> None:
    """A worker's loop: tasks in (lists of entries as plain tuples), results out, until the
    parent closes its end or dies; ``keys``: each entry's record's key (small records are
    then sent as runs under their keys); ``warm``: run first (the decoders loaded while the
    parent prepares the first tasks)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    faulthandler.disable()  # a decoder's crash is reported by the parent, in one line
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        return  # the parent died before the death signal was asked for
    keep_the_heap(WORKER_HEAP)
    if warm is not None:
        warm()
    out = conn.fileno()
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        message = ResultMessage(ring)
        for fields in task:
            entry = _entry(ListEntry, fields)
            result = attempt(work, root, entry)
            message.add(result, None if keys is None or type(result) is str else keys(entry))
            if message.size >= MESSAGE_BYTES:
                send_message(out, message.parts())
                message = ResultMessage(ring)
        if message.sizes:
            send_message(out, message.parts())
