"""Drop-ins for Caffe's tools, with Caffe's command lines and log lines.

- ``convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file``
- ``compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]``
- ``convert_mnist_siamese_data [FLAGS] input_image_file input_label_file output_db_file``

All three parse their command line with :mod:`mnist2db.caffe_tools.gflags` (gflags' syntax, gflags' and
glog's own flags, errors as ``ERROR: …`` lines and exit 1) and log with :mod:`mnist2db.caffe_tools.glog`
(the lines Caffe logs, with Caffe's source locations). The wrong number of arguments prints
the usage on stderr and exits 2; a failure of the work is one ``E…`` line and exit 1.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable

from mnist2db.caffe_tools.gflags import Flag, FlagError, ParsedArgs, parse_command_line, usage_text
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.storage.backends import BACKENDS, DEFAULT_BACKEND, DEFAULT_BATCH_SIZE, SIAMESE_BACKEND
from mnist2db.version import __version__

if TYPE_CHECKING:
    from mnist2db.caffe_tools.glog import Logger

PROG = "convert_mnist_data"

USAGE = """\
This script converts the MNIST dataset to
the lmdb/leveldb format used by Caffe to load data.
Usage:
    convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file
The MNIST dataset could be downloaded at
    http://yann.lecun.com/exdb/mnist/
You should gunzip them after downloading,or directly use data/mnist/get_mnist.sh
(mnist2db also reads the .gz files as they are; `mnist2db fetch` downloads them.)
"""

MEAN_USAGE = """\
Compute the mean_image of a set of images given by a leveldb/lmdb
Usage:
    compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]
"""

SIAMESE_USAGE = """\
This script converts the MNIST dataset to the leveldb format used
by caffe to train a siamese network.
Usage:
    convert_mnist_data input_image_file input_label_file output_db_file
The MNIST dataset could be downloaded at
    http://yann.lecun.com/exdb/mnist/
You should gunzip them after downloading.
(mnist2db reads the .gz files as they are; --backend, --seed, --pairs, --balanced and
--overwrite are mnist2db extensions.)
"""


def _at_least_one(value: object) -> bool:
    return isinstance(value, int) and value >= 1


#: The flags of convert_mnist_data (examples/mnist/convert_mnist_data.cpp).
FLAGS: dict[str, Flag] = {
    "backend": Flag("backend", "string", DEFAULT_BACKEND, "The backend for storing the result"),
    "batch_size": Flag(
        "batch_size",
        "int32",
        DEFAULT_BATCH_SIZE,
        "Records per transaction, fewer above 64 MiB (mnist2db extension)",
        _at_least_one,
    ),
    "overwrite": Flag(
        "overwrite",
        "bool",
        False,
        "Replace an existing database at output_db_file (mnist2db extension)",
    ),
}

MEAN_FLAGS: dict[str, Flag] = {
    "backend": Flag(
        "backend", "string", DEFAULT_BACKEND, "The backend {leveldb, lmdb} containing the images"
    ),
}

SIAMESE_FLAGS: dict[str, Flag] = {
    "backend": Flag(
        "backend",
        "string",
        SIAMESE_BACKEND,
        "The backend for storing the result (mnist2db extension)",
    ),
    "seed": Flag(
        "seed",
        "int64",
        -1,
        "Seed of the pair draws, 0 to 18446744073709551615 (every seed a run reports); "
        "-1: a fresh one each run (mnist2db extension)",
        bounds=(-(1 << 63), (1 << 64) - 1),
    ),
    "pairs": Flag("pairs", "int64", -1, "Number of pairs; -1: one per image (mnist2db extension)"),
    "balanced": Flag(
        "balanced", "bool", False, "Make half the pairs same-class (mnist2db extension)"
    ),
    "overwrite": Flag(
        "overwrite",
        "bool",
        False,
        "Replace an existing database at output_db_file (mnist2db extension)",
    ),
}

#: Where Caffe logs each line it shares with the drop-ins (glog's file:line).
OPENED_AT = {"lmdb": "db_lmdb.cpp:35", "leveldb": "db_leveldb.cpp:18"}


def parse_flags(argv: list[str], argv0: str = PROG) -> ParsedArgs:
    """Parse a convert_mnist_data command line as gflags does (see :mod:`mnist2db.caffe_tools.gflags`)."""
    return parse_command_line(argv, FLAGS, argv0)


def _here() -> str:
    """The caller's ``file:line``, for mnist2db's own log lines (as glog records its own)."""
    frame = sys._getframe(1)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _run_tool(
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
        logger.log("E", _here(), str(exc))
        if not logger.enabled("E"):
            sys.stderr.write(f"{exc}\n")
        return 1
    return 0


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# -- convert_mnist_data -------------------------------------------------------------------


def _convert_mnist_data(parsed: ParsedArgs, logger: Logger) -> None:
    from mnist2db.conversion import convert
    from mnist2db.errors import Mnist2dbError
    from mnist2db.formats.datum import check_record_count
    from mnist2db.formats.idx import check_pair
    from mnist2db.formats.idx_reader import read_header
    from mnist2db.storage.targets import check_destination

    backend = str(parsed["backend"])
    image_file, label_file, db_path = parsed.positional
    overwrite = bool(parsed["overwrite"])
    batch_size = int(parsed["batch_size"])  # type: ignore[call-overload]

    def log_start(count: int, rows: int, cols: int) -> None:
        logger.log("I", OPENED_AT[backend], f"Opened {backend} {db_path}")
        logger.log("I", "convert_mnist_data.cpp:88", f"A total of {count} items.")
        logger.log("I", "convert_mnist_data.cpp:89", f"Rows: {rows} Cols: {cols}")

    # Caffe logs these lines once the database is open, before the first record, and
    # refuses a pair its reader would not take (an idx2-int label file among them) before
    # writing anything. A pipe's header is read ahead for that and its bytes relayed on
    # (:mod:`mnist2db.formats.idx_pipe`): a pipe can be read only once.
    early = backend in BACKENDS and (overwrite or not os.path.lexists(db_path))
    with contextlib.ExitStack() as stack:
        sources: list[str] = []
        relays: dict[str, str] = {}
        headers = []
        for path in (image_file, label_file):
            if not early or _regular(path):
                sources.append(path)
                if early:
                    headers.append(read_header(path))
                continue
            from mnist2db.formats.idx_pipe import (
                peek_pipe,  # only for a pipe: threading stays off the fast path
            )

            header, relayed = stack.enter_context(peek_pipe(path))
            headers.append(header)
            sources.append(relayed)
            relays[relayed] = path
        try:
            if early:
                # What Caffe checks before it opens the database (the headers), then what
                # opening it would find (the target) and what convert refuses up front:
                # Caffe's lines follow only then, as its mkdir precedes them.
                check_pair(headers[0], headers[1])
                count, rows, cols = headers[0].count, headers[0].dims[1], headers[0].dims[2]
                check_record_count(count, image_file, "items")
                check_destination(db_path, backend, overwrite, (image_file, label_file))
                log_start(count, rows, cols)
            result = convert(
                sources[0],
                sources[1],
                db_path,
                backend=backend,
                batch_size=batch_size,
                overwrite=overwrite,
            )
        except Mnist2dbError as exc:
            message = str(exc)
            for relayed, path in relays.items():
                message = message.replace(relayed, path)
            exc.args = (message,)
            raise
    if not early:
        log_start(result.count, result.rows, result.cols)
    logger.log("I", "convert_mnist_data.cpp:108", f"Processed {result.count} files.")


def run(argv: list[str], argv0: str = PROG) -> int:
    """Run convert_mnist_data on ``argv`` (without the program name); the exit code."""
    return _run_tool(
        argv,
        argv0,
        FLAGS,
        USAGE,
        "examples/mnist/convert_mnist_data.cpp",
        (3,),
        _convert_mnist_data,
        alsologtostderr=True,
    )


# -- compute_image_mean -------------------------------------------------------------------


def _compute_image_mean(parsed: ParsedArgs, logger: Logger) -> None:
    from mnist2db.errors import BackendError
    from mnist2db.mean import check_mean_target
    from mnist2db.storage.backends import check_backend, detect_backend
    from mnist2db.storage.readers import shared_reader

    backend = str(parsed["backend"])
    db_path = parsed.positional[0]
    check_backend(backend)
    found = detect_backend(db_path)
    if found != backend:
        raise BackendError(f"{db_path}: is a {found} database (use --backend={found})")
    if len(parsed.positional) == 2:
        check_mean_target(parsed.positional[1], overwrite=True, inputs=[db_path])
    # Opened before Caffe's "Opened" line, as Caffe opens it (a database that does not open
    # is refused before), and held: compute_mean reads through the same handle.
    with shared_reader(db_path, backend):
        logger.log("I", OPENED_AT[backend], f"Opened {backend} {db_path}")
        _mean_of_opened(parsed, logger, db_path, backend)


def _mean_of_opened(parsed: ParsedArgs, logger: Logger, db_path: str, backend: str) -> None:
    from mnist2db.mean import compute_mean, write_mean

    logger.log("I", "compute_image_mean.cpp:70", "Starting iteration")

    def progress(done: int, total: int) -> None:
        if done % 10000 == 0:
            logger.log("I", "compute_image_mean.cpp:95", f"Processed {done} files.")

    result = compute_mean(db_path, backend, batch_size=DEFAULT_BATCH_SIZE, progress=progress)
    if result.count % 10000:
        logger.log("I", "compute_image_mean.cpp:101", f"Processed {result.count} files.")
    if len(parsed.positional) == 2:
        out = parsed.positional[1]
        logger.log("I", "compute_image_mean.cpp:108", f"Write to {out}")
        # Caffe replaces the file; so does the drop-in (atomically, and never a directory).
        write_mean(result, out, overwrite=True, npy=False)
    logger.log("I", "compute_image_mean.cpp:114", f"Number of channels: {result.mean.shape[0]}")
    for channel, value in enumerate(result.caffe_channel_means()):
        logger.log("I", "compute_image_mean.cpp:119", f"mean_value channel [{channel}]: {value:g}")


def compute_image_mean(argv: list[str], argv0: str = "compute_image_mean") -> int:
    """Run compute_image_mean on ``argv`` (without the program name); the exit code."""
    return _run_tool(
        argv,
        argv0,
        MEAN_FLAGS,
        MEAN_USAGE,
        "tools/compute_image_mean.cpp",
        (1, 2),
        _compute_image_mean,
        alsologtostderr=True,
    )


# -- convert_mnist_siamese_data -----------------------------------------------------------


def _convert_mnist_siamese_data(parsed: ParsedArgs, logger: Logger) -> None:
    from mnist2db.siamese import convert_siamese

    image_file, label_file, db_path = parsed.positional
    seed = int(parsed["seed"])  # type: ignore[call-overload]
    pairs = int(parsed["pairs"])  # type: ignore[call-overload]

    def log_start(count: int, rows: int, cols: int) -> None:
        logger.log("I", "convert_mnist_siamese_data.cpp:85", f"A total of {count} items.")
        logger.log("I", "convert_mnist_siamese_data.cpp:86", f"Rows: {rows} Cols: {cols}")

    result = convert_siamese(
        image_file,
        label_file,
        db_path,
        backend=str(parsed["backend"]),
        seed=None if seed == -1 else seed,
        pairs=None if pairs == -1 else pairs,
        balanced=bool(parsed["balanced"]),
        overwrite=bool(parsed["overwrite"]),
        on_start=log_start,
    )
    logger.log(
        "I",
        _here(),
        f"Wrote {result.count} pairs ({result.positives} same-class), seed {result.seed}.",
    )


def convert_mnist_siamese_data(argv: list[str], argv0: str = "convert_mnist_siamese_data") -> int:
    """Run convert_mnist_siamese_data on ``argv`` (without the program name); the exit code."""
    return _run_tool(
        argv,
        argv0,
        SIAMESE_FLAGS,
        SIAMESE_USAGE,
        "examples/siamese/convert_mnist_siamese_data.cpp",
        (3,),
        _convert_mnist_siamese_data,
        alsologtostderr=False,  # Caffe's siamese tool logs INFO to its log file only
    )


# -- entry points -------------------------------------------------------------------------


def _main(tool: Callable[[list[str], str], int], name: str) -> None:
    from mnist2db.interrupt import run

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else name
    sys.exit(run(lambda: tool(sys.argv[1:], argv0)))


#: For the drop-ins in other modules (convert_imageset): the same frame and entry point.
run_tool = _run_tool
tool_main = _main
log_here = _here


def main() -> None:
    """Entry point of the ``convert_mnist_data`` console script."""
    _main(run, PROG)


def mean_main() -> None:
    """Entry point of the ``compute_image_mean`` console script."""
    _main(compute_image_mean, "compute_image_mean")


def siamese_main() -> None:
    """Entry point of the ``convert_mnist_siamese_data`` console script."""
    _main(convert_mnist_siamese_data, "convert_mnist_siamese_data")
