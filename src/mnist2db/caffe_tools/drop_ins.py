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

from mnist2db.caffe_tools.frame import OPENED_AT, log_here, run_tool, tool_main
from mnist2db.caffe_tools.gflags import Flag, ParsedArgs, parse_command_line
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.interrupt import as_script
from mnist2db.storage.backends import (
    BATCH_BYTES_LIMIT,
    DEFAULT_BACKEND,
    DEFAULT_BATCH_SIZE,
    SIAMESE_BACKEND,
)

if TYPE_CHECKING:
    from mnist2db.caffe_tools.glog import Logger
    from mnist2db.formats.idx import IdxHeader

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
        f"Records per transaction, fewer above {BATCH_BYTES_LIMIT >> 20} MiB (mnist2db extension)",
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


def parse_flags(argv: list[str], argv0: str = PROG) -> ParsedArgs:
    """Parse a convert_mnist_data command line as gflags does (see :mod:`mnist2db.caffe_tools.gflags`)."""
    return parse_command_line(argv, FLAGS, argv0)


# -- convert_mnist_data -------------------------------------------------------------------


def _convert_mnist_data(parsed: ParsedArgs, logger: Logger) -> None:
    from mnist2db.conversion import convert
    from mnist2db.formats.idx import check_pair

    backend = str(parsed["backend"])
    image_file, label_file, db_path = parsed.positional

    def log_start(images: IdxHeader, labels: IdxHeader) -> None:
        # Caffe's reader takes only magic 2049 labels (convert also takes QMNIST's idx2-int
        # rows): refused here, before Caffe's lines, which follow once the database is open
        # and precede the first record.
        check_pair(images, labels)
        logger.log("I", OPENED_AT[backend], f"Opened {backend} {db_path}")
        logger.log("I", "convert_mnist_data.cpp:88", f"A total of {images.count} items.")
        logger.log(
            "I", "convert_mnist_data.cpp:89", f"Rows: {images.dims[1]} Cols: {images.dims[2]}"
        )

    result = convert(
        image_file,
        label_file,
        db_path,
        backend=backend,
        batch_size=int(parsed["batch_size"]),  # type: ignore[call-overload]
        overwrite=bool(parsed["overwrite"]),
        on_start=log_start,
    )
    logger.log("I", "convert_mnist_data.cpp:108", f"Processed {result.count} files.")


def run(argv: list[str], argv0: str = PROG) -> int:
    """Run convert_mnist_data on ``argv`` (without the program name); the exit code."""
    return run_tool(
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
    return run_tool(
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
        log_here(),
        f"Wrote {result.count} pairs ({result.positives} same-class), seed {result.seed}.",
    )


def convert_mnist_siamese_data(argv: list[str], argv0: str = "convert_mnist_siamese_data") -> int:
    """Run convert_mnist_siamese_data on ``argv`` (without the program name); the exit code."""
    return run_tool(
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


def main() -> None:
    """Entry point of the ``convert_mnist_data`` console script."""
    tool_main(run, PROG)


def mean_main() -> None:
    """Entry point of the ``compute_image_mean`` console script."""
    tool_main(compute_image_mean, "compute_image_mean")


def siamese_main() -> None:
    """Entry point of the ``convert_mnist_siamese_data`` console script."""
    tool_main(convert_mnist_siamese_data, "convert_mnist_siamese_data")


# The installed scripts: each main, the process ended without the interpreter's teardown.
def script() -> None:
    as_script(main)


def mean_script() -> None:
    as_script(mean_main)


def siamese_script() -> None:
    as_script(siamese_main)
