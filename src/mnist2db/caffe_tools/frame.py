"""The frame every Caffe drop-in shares (``convert_mnist_data``, ``compute_image_mean``,
``convert_mnist_siamese_data``, ``convert_imageset``): its command line parsed as gflags
parses it, ``--help``, ``--version`` and the usage on the wrong number of arguments, glog's
logger, a library error as one ``E`` line and exit 1, and the console-script entry point
under :func:`mnist2db.interrupt.run` (Ctrl-C: 130, SIGTERM: 143).

A drop-in is a function ``work(parsed, logger)`` and the table of its flags; this module
runs it (:func:`run_tool`) and is on the fast path (:data:`mnist2db.fastpath.FAST_PATH`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from mnist2db.caffe_tools.gflags import Flag, FlagError, ParsedArgs, parse_command_line, usage_text
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.version import __version__

if TYPE_CHECKING:
    from mnist2db.caffe_tools.glog import Logger

#: Where Caffe logs each line it shares with the drop-ins (glog's file:line).
OPENED_AT = {"lmdb": "db_lmdb.cpp:35", "leveldb": "db_leveldb.cpp:18"}


def log_here() -> str:
    """The caller's ``file:line``, for mnist2db's own log lines (as glog records its own)."""
    frame = sys._getframe(1)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def run_tool(
    argv: list[str],
    argv0: str,
    flags: dict[str, Flag],
    usage: str,
    source: str,
    arity: tuple[int, ...],
    work: Callable[[ParsedArgs, Logger], None],
    alsologtostderr: bool,
) -> int:
    """Parse, handle help/version/usage, then run ``work(parsed, logger)``; the exit code."""
    from mnist2db.caffe_tools.glog import Logger as GlogLogger

    # Caffe's convert_mnist_data and compute_image_mean set FLAGS_alsologtostderr = 1 before
    # parsing their command line, which may still turn it off.
    preset: dict[str, object] = {"alsologtostderr": True} if alsologtostderr else {}
    try:
        parsed = parse_command_line(argv, flags, argv0, preset=preset)
    except FlagError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if parsed.help:
        sys.stdout.write(usage_text(argv0, usage, source, flags))
        return 0
    if parsed.version:
        sys.stdout.write(f"{os.path.basename(argv0)} (mnist2db) version {__version__}\n")
        return 0
    if len(parsed.positional) not in arity:
        sys.stderr.write(usage_text(argv0, usage, source, flags))
        return 2
    logger = GlogLogger(parsed)
    from mnist2db.errors import Mnist2dbError

    try:
        work(parsed, logger)
    except Mnist2dbError as exc:
        logger.log("E", log_here(), str(exc))
        if not logger.enabled("E"):
            sys.stderr.write(f"{exc}\n")
        return 1
    return 0


def tool_main(tool: Callable[[list[str], str], int], name: str) -> None:
    """A console script's entry point: ``tool(sys.argv[1:], argv0)`` under
    :func:`mnist2db.interrupt.run`, its exit code the process's."""
    from mnist2db.interrupt import run

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else name
    sys.exit(run(lambda: tool(sys.argv[1:], argv0)))
