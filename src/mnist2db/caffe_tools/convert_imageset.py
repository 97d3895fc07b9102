"""``convert_imageset ROOTFOLDER/ LISTFILE DB_NAME``: Caffe's tool, byte for byte, as a drop-in.

Caffe's command line (gflags: ``--gray --shuffle --backend --resize_width --resize_height
--check_size --encoded --encode_type``, and gflags' and glog's own flags) and log lines;
the records are Caffe's (:mod:`mnist2db.imageset.to_database`). Where Caffe aborts half-way or writes
nothing without a word, this refuses in one line and leaves nothing behind. Extensions:
``--overwrite`` (replace an existing database of the backend), ``--seed`` (a repeatable
``--shuffle``; Caffe's draws from ``/dev/urandom``), ``--jobs N`` or ``-j N`` (worker
processes decoding; default one per processor), ``--resume`` (continue a conversion that
was killed, from the batches it committed: :mod:`mnist2db.imageset.resume`).
"""

from __future__ import annotations

from mnist2db.caffe_tools.frame import OPENED_AT, log_here, run_tool, tool_main
from mnist2db.caffe_tools.gflags import Flag, ParsedArgs
from mnist2db.caffe_tools.glog import Logger
from mnist2db.errors import ArgumentError
from mnist2db.fastpath import TYPE_CHECKING
from mnist2db.formats.imdecode.image_file import ignore_decoder_warnings
from mnist2db.formats.lists.image_list import ImageList, ListIndex
from mnist2db.interrupt import as_script
from mnist2db.selection import fresh_seed, seed_note
from mnist2db.storage.databases.backends import DEFAULT_BACKEND
from mnist2db.storage.destinations import check_destination

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from mnist2db.formats.lists.image_list import ListEntry
    from mnist2db.labels.databases import TargetSource

PROG = "convert_imageset"

USAGE = """\
Convert a set of images to the leveldb/lmdb
format used as input for Caffe.
Usage:
    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME
The ImageNet dataset for the training demo is at
    http://www.image-net.org/download-images
(mnist2db: --overwrite, --seed, --jobs/-j, --resume, --targets and --targets_width are
extensions.)
"""

#: The flags of tools/convert_imageset.cpp, then mnist2db's.
FLAGS: dict[str, Flag] = {
    "gray": Flag("gray", "bool", False, "When this option is on, treat images as grayscale ones"),
    "shuffle": Flag(
        "shuffle", "bool", False, "Randomly shuffle the order of images and their labels"
    ),
    "backend": Flag(
        "backend", "string", DEFAULT_BACKEND, "The backend {lmdb, leveldb} for storing the result"
    ),
    "resize_width": Flag("resize_width", "int32", 0, "Width images are resized to"),
    "resize_height": Flag("resize_height", "int32", 0, "Height images are resized to"),
    "check_size": Flag(
        "check_size",
        "bool",
        False,
        "When this option is on, check that all the datum have the same size",
    ),
    "encoded": Flag(
        "encoded", "bool", False, "When this option is on, the encoded image will be save in datum"
    ),
    "encode_type": Flag(
        "encode_type",
        "string",
        "",
        "Optional: What type should we encode the image as ('png','jpg',...).",
    ),
    "overwrite": Flag(
        "overwrite", "bool", False, "Replace an existing database at DB_NAME (mnist2db extension)"
    ),
    "seed": Flag(
        "seed", "int64", -1, "Seed of --shuffle; -1: a fresh one each run (mnist2db extension)"
    ),
    "jobs": Flag(
        "jobs",
        "int32",
        0,
        "Worker processes decoding images; 0: one per processor, at most 8 (mnist2db extension)",
        bounds=(0, 1 << 16),
    ),
    "j": Flag("j", "int32", 0, "Short for --jobs (mnist2db extension)", bounds=(0, 1 << 16)),
    "resume": Flag(
        "resume",
        "bool",
        False,
        "Continue the conversion to DB_NAME that a kill interrupted (mnist2db extension)",
    ),
    "targets": Flag(
        "targets",
        "string",
        "",
        "'list': LISTFILE lines are PATH V1 ... VN; 'table': LISTFILE is a label table with a "
        "header (CSV, or CelebA's list_attr_celeba.txt); the values go to DB_NAME_labels, "
        "a float_data database under the same keys (mnist2db extension)",
    ),
    "targets_width": Flag(
        "targets_width",
        "int32",
        0,
        "With --targets=list: N, the values a line; 0: from the first line (mnist2db extension)",
    ),
}


def _convert(parsed: ParsedArgs, logger: Logger) -> None:
    from mnist2db.formats.imread.cv2_wheel import decoder_note
    from mnist2db.imageset.resume import staged_seed
    from mnist2db.imageset.to_database import Skipped, write_imageset

    root, listing, db_path = parsed.positional
    ignore_decoder_warnings()
    backend = str(parsed["backend"])
    overwrite = bool(parsed["overwrite"])
    encode_type = str(parsed["encode_type"])
    width = max(0, int(parsed["resize_width"]))  # type: ignore[call-overload]
    height = max(0, int(parsed["resize_height"]))  # type: ignore[call-overload]
    if (width > 0) != (height > 0):
        logger.log(
            "W", log_here(), "only one of --resize_width and --resize_height given: no resize "
            "(Caffe resizes only when both are)",
        )  # fmt: skip
    resize = (width, height) if width and height else None
    shuffle = bool(parsed["shuffle"])
    resume = bool(parsed["resume"])
    shuffled: ListIndex | None = None
    picks: Any = None
    seed: int | None = None
    targets = _targets(parsed, listing)
    listed_once = ImageList(listing)  # a pipe is read once, whatever the passes
    if shuffle:
        import numpy as np

        seed = int(parsed["seed"])  # type: ignore[call-overload]
        if seed == -1 and resume:
            seed = staged_seed(db_path)
        if seed == -1:
            seed = fresh_seed(1 << 63)
        if not 0 <= seed < 1 << 63:
            raise ArgumentError(f"--seed must be between 0 and 2**63-1, got {seed}")
        logger.log("I", "convert_imageset.cpp:86", "Shuffling data")
        logger.log("I", log_here(), seed_note(seed, "--seed="))
        if targets is not None:
            count = targets.count()
            picks = np.argsort(np.random.PCG64(seed).random_raw(count), kind="stable")
            targets = type(targets)(targets.table, picks)  # the same rows, shuffled
        else:  # an index of the list's lines and the order, not the entries twice
            shuffled = ListIndex(listed_once)
            picks = np.argsort(np.random.PCG64(seed).random_raw(len(shuffled)), kind="stable")

    def entries() -> Iterable[ListEntry]:
        if targets is not None:
            return targets.entries()
        return shuffled.entries(picks) if shuffled is not None else listed_once()

    def started(total: int) -> None:
        logger.log("I", "convert_imageset.cpp:89", f"A total of {total} images.")
        if encode_type and not parsed["encoded"]:
            logger.log(
                "I", "convert_imageset.cpp:92", "encode_type specified, assuming encoded=true."
            )
        # Caffe fails opening (mkdir) before its "Opened" line: the target is checked here.
        check_destination(db_path, backend, overwrite, [listing])
        logger.log("I", OPENED_AT.get(backend, "db.cpp:0"), f"Opened {backend} {db_path}")

    def skipped(gone: Skipped) -> None:
        logger.log("E", "io.cpp:80", f"Could not open or find file {gone.reason}")

    def stale(path: str) -> None:
        logger.log(
            "W", log_here(), f"{path}: a staged run of a killed conversion: removed "
            "(--resume would continue it)",
        )  # fmt: skip

    def progress(done: int, total: int) -> None:
        if done % 1000 == 0:
            logger.log("I", "convert_imageset.cpp:147", f"Processed {done} files.")

    result = write_imageset(
        root,
        entries,
        db_path,
        backend,
        gray=bool(parsed["gray"]),
        resize=resize,
        encoded=bool(parsed["encoded"]),
        encode_type=encode_type or None,
        check_size=bool(parsed["check_size"]),
        overwrite=overwrite,
        where=listing,
        inputs=[listing],
        progress=progress,
        on_skip=skipped,
        on_start=started,
        jobs=int(parsed["j"] or parsed["jobs"]) or None,  # type: ignore[call-overload]
        resume=resume,
        seed=seed,
        on_stale=stale,
        targets=targets,
    )
    if result.count % 1000:
        logger.log("I", "convert_imageset.cpp:153", f"Processed {result.count} files.")
    if result.skipped:
        logger.log(
            "W",
            log_here(),
            f"Skipped {len(result.skipped)} of {result.lines} images that could not be read "
            "(their keys are left out, as Caffe leaves them).",
        )
    logger.log("I", log_here(), decoder_note())
    rate = result.count / max(result.seconds, 1e-9)
    logger.log(
        "I",
        log_here(),
        f"Wrote {result.count} records in {result.seconds:.2f} s ({rate:.0f} images/s).",
    )
    if result.labels is not None:
        from mnist2db.labels.databases import describe

        logger.log("I", log_here(), describe(result.labels))


def _targets(parsed: ParsedArgs, listing: str) -> TargetSource | None:
    """The label table --targets names (None without it): mnist2db's extension."""

    kind = str(parsed["targets"])
    width = int(parsed["targets_width"])  # type: ignore[call-overload]
    if not kind:
        if width:
            raise ArgumentError("--targets_width is the width of a --targets=list: give --targets")
        return None
    if kind not in ("list", "table"):
        raise ArgumentError(f"--targets is 'list' or 'table', got {kind!r}")
    if width < 0 or (width and kind == "table"):
        raise ArgumentError("--targets_width is N ≥ 0 of a --targets=list (a table's header "
                            "gives its width)")  # fmt: skip
    from mnist2db.formats.lists.label_table import open_label_table
    from mnist2db.labels.databases import TargetSource

    return TargetSource(open_label_table(listing, header=kind == "table", width=width or None))


def convert_imageset(argv: list[str], argv0: str = PROG) -> int:
    """Run convert_imageset on ``argv`` (without the program name); the exit code."""
    return run_tool(
        argv, argv0, FLAGS, USAGE, "tools/convert_imageset.cpp", (3,), _convert,
        alsologtostderr=True,
    )  # fmt: skip


def main() -> None:
    """Entry point of the ``convert_imageset`` console script."""
    tool_main(convert_imageset, PROG)


def script() -> None:
    """The installed script: :func:`main`, the process ended without the interpreter's
    teardown (:func:`mnist2db.interrupt.as_script`)."""
    as_script(main)


if __name__ == "__main__":  # pragma: no cover
    script()
