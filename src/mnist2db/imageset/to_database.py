"""Image files to Caffe Datum records, as ``convert_imageset`` writes them (an IDX pair
instead: :mod:`mnist2db.imageset.to_idx`).

Each entry of a list (:mod:`mnist2db.formats.lists.image_list`) names an image under a root
folder (Caffe joins the two as text: ``ROOT + PATH``) and its label. Its record, under
Caffe's key ``%08d_PATH`` (the line's number), is

* raw (the default): the pixels as OpenCV reads them (:mod:`mnist2db.formats.imread.reader`),
  resized by OpenCV's bilinear (:mod:`mnist2db.formats.imread.resize`) when a size is given,
  channel after channel (BGR), with ``channels``, ``height``, ``width``, ``label`` and an
  explicit ``encoded: false``;
* encoded: the file's own bytes when it is not resized and its extension is the encoding's
  (``--encoded`` alone takes each file's extension), else the pixels re-encoded as OpenCV
  would; ``data``, ``label`` and ``encoded: true`` only, as Caffe leaves them.

An image that cannot be read is skipped, as Caffe skips it (its line number leaves a gap
in the keys), and reported. What Caffe aborts on or silently gets wrong is refused before
anything is written, in one line: a key over LMDB's 511 bytes, more than 10**8 lines, a
root folder without its ``/``, a type that cannot be encoded; ``check_size`` refuses the
first image of another size; a run in which no image could be read writes nothing. The
database is staged and placed whole (:mod:`mnist2db.storage.db_staging`); batches are bounded
by records and by bytes.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterable, Iterator

from mnist2db.conversion import write_database
from mnist2db.errors import ArgumentError, ImageError, Mnist2dbError, printable
from mnist2db.fastpath import TYPE_CHECKING, NamedTuple, named_tuple
from mnist2db.formats.datum.message import KEY_LIMIT
from mnist2db.formats.imdecode.image_file import check_resize
from mnist2db.formats.imread.encode_types import ENCODE_TYPES, encoding_of, matches_ext
from mnist2db.formats.lists.image_list import ListEntry, image_key
from mnist2db.imageset.batches import record_batches
from mnist2db.imageset.resume import (
    Committed,
    EntryDigest,
    InputRecorder,
    check_inputs,
    check_plan,
    find_staged_labels,
    find_staged_run,
    initial_identity,
    owner_fields,
    recording_batches,
    remove_plan,
    write_plan,
)
from mnist2db.imageset.work import RecordWork
from mnist2db.imageset.workers.loop import attempt
from mnist2db.imageset.workers.pool import OrderedDecoding, default_jobs
from mnist2db.progress import Progress, reporting
from mnist2db.recipe import write_metadata
from mnist2db.storage.databases.backends import (
    BACKEND,
    DEFAULT_BATCH_SIZE,
    check_backend,
    check_batch_size,
)
from mnist2db.storage.db_staging import staged_database, staged_databases, stale_staging
from mnist2db.storage.destinations import labels_path
from mnist2db.storage.digest_state import remove_saved_states
from mnist2db.storage.files import temp_prefix

if TYPE_CHECKING:
    from typing import Any

    from mnist2db.labels.databases import LabelsResult, TargetSource

#: Batches written between two releases of LMDB's mapped pages (:func:`_unmapping`).
RELEASE_EVERY = 8

#: A source of entries: called once per pass (the list is read twice: checked, then written).
Entries = Callable[[], Iterable[ListEntry]]
#: Entries the list's check keeps for the writing pass, which then does not read the list
#: again (7 MB of entries at most: a list of MNIST-size images is read once); a longer list
#: is read again, in bounded memory at any size.
KEPT_ENTRIES = 1 << 16


@named_tuple
class Skipped(NamedTuple):
    """An image that could not be read: its entry and why."""

    entry: ListEntry
    reason: str


@named_tuple
class ImagesetResult(NamedTuple):
    """What :func:`write_imageset` wrote: ``path``, ``backend``, ``count`` (records),
    ``lines`` (entries listed), ``skipped`` (images that could not be read), ``shape``
    (``(channels, height, width)`` when every raw record has it, else None), ``seconds``."""

    path: str
    backend: str
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    lines: int
    skipped: tuple[Skipped, ...]
    shape: tuple[int, int, int] | None
    seconds: float
    labels: LabelsResult | None = None  # the label database written beside, if any

    def summary(self) -> str:
        skipped = ""
        if self.skipped:
            names = ", ".join(printable(os.fsdecode(s.entry.path)) for s in self.skipped[:3])
            more = f" and {len(self.skipped) - 3} more" if len(self.skipped) > 3 else ""
            skipped = f"; skipped {len(self.skipped)} that could not be read ({names}{more})"
        shape = "" if self.shape is None else " of {} × {} × {}".format(*self.shape)
        rate = self.count / max(self.seconds, 1e-9)
        labels = ""
        if self.labels is not None:
            from mnist2db.labels.databases import describe

            labels = "\n" + describe(self.labels)
        return (
            f"Wrote {self.count} records{shape} from {self.lines} listed images{skipped}.\n"
            f"Wrote {printable(self.path)} ({self.backend}) in {self.seconds:.2f} s "
            f"({rate:.0f} images/s).{labels}"
        )


def check_entries(
    entries: Iterable[ListEntry],
    *,
    root: bytes,
    backend: str,
    encoded: bool,
    encode_type: str | None,
    resize: tuple[int, int] | None,
    where: str,
    digest: EntryDigest | None = None,
) -> int:
    """Check every entry before any work; returns their number (and feeds ``digest``).

    Raises:
        Mnist2dbError: more than 10**8 lines, an LMDB key over 511 bytes, a type that
            cannot be encoded, or a root folder missing its ``/`` (each naming the line).
    """
    count = 0
    first: ListEntry | None = None
    # The longest key the backend stores (LMDB's 511 bytes; an IDX pair has no keys).
    key_limit = BACKEND[backend].key_limit if backend in BACKEND else None
    # A key is "%08d_" (9 bytes below KEY_LIMIT lines) and the path.
    path_limit = 1 << 62 if key_limit is None else key_limit - 9
    add = digest.add if digest is not None else None
    rules = encoded or encode_type
    for entry in entries:
        count += 1
        if first is None:
            first = entry
        if add is not None:
            add(entry)
        if entry.line >= KEY_LIMIT:
            raise Mnist2dbError(
                f"{where}: more than {KEY_LIMIT} lines: Caffe's keys (%08d_PATH) stop sorting "
                "in line order there"
            )
        if len(entry.path) > path_limit:
            key = image_key(entry)
            raise Mnist2dbError(
                f"{where}:{entry.line + 1}: the key {printable(os.fsdecode(key[:40]))}… is "
                f"{len(key)} bytes; LMDB keys hold at most {key_limit} (shorten the "
                "path, or use --backend leveldb)"
            )
        if rules:
            kind = encoding_of(entry, encode_type)
            reencoded = resize is not None or not matches_ext(root + entry.path, kind)
            if reencoded and kind not in ENCODE_TYPES:
                shown = printable(os.fsdecode(entry.path))
                raise ImageError(
                    f"{where}:{entry.line + 1}: {shown}: cannot encode as {kind!r} "
                    f"(written as Caffe writes them: {', '.join(ENCODE_TYPES)}); "
                    "give --encode_type"
                )
    if first is not None and root and not root.endswith(b"/") and os.path.isdir(root):
        joined = root + first.path
        if not os.path.lexists(joined) and os.path.lexists(root + b"/" + first.path):
            shown = printable(os.fsdecode(root))
            raise Mnist2dbError(
                f"{shown}: the root folder does not end with '/': Caffe joins it to each "
                f"path as text ({printable(os.fsdecode(joined))}, which does not exist); "
                f"write {shown}/"
            )
    return count


def write_imageset(
    root: str | bytes,
    entries: Entries,
    out: str | os.PathLike[str],
    backend: str = "lmdb",
    *,
    gray: bool = False,
    resize: tuple[int, int] | None = None,
    encoded: bool = False,
    encode_type: str | None = None,
    check_size: bool = False,
    overwrite: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    where: str = "list",
    inputs: Iterable[str] = (),
    metadata: dict[str, Any] | None = None,
    progress: Progress | None = None,
    on_skip: Callable[[Skipped], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    jobs: int | None = None,
    resume: bool = False,
    seed: int | None = None,
    on_stale: Callable[[str], None] | None = None,
    targets: TargetSource | None = None,
) -> ImagesetResult:
    """Write the images ``entries()`` names (under ``root``) to a new database at ``out``.

    Args:
        root: prefix joined to each path as text, as Caffe joins it (``"photos/"``).
        entries: returns the entries, in key order; called twice (checked, then written).
        gray: read grey (``IMREAD_GRAYSCALE``) instead of BGR colour.
        resize: ``(width, height)`` to resize every image to.
        encoded, encode_type: store encoded images (see the module docstring).
        check_size: refuse an image whose shape differs from the first one's.
        where: the list's name, for messages.
        inputs: paths the output must not replace (the list file, the root).
        metadata: written as ``mnist2db.json`` beside the records (None: nothing).
        on_skip: called for each image that cannot be read, when it is skipped.
        on_start: called with the number of entries once they are checked.
        jobs: worker processes decoding (None: one per processor this process may use;
            0: decode in this process).
        resume: continue the staged run a killed conversion of ``out`` left, when its plan
            is this one's (:mod:`mnist2db.imageset.resume`); else refuse, naming what differs.
        seed: the seed that shuffled ``entries`` (recorded in the plan, for a resume).
        on_stale: called with each staged run of a killed conversion that this run
            (without ``resume``) removes.
        targets: the entries' targets: a label database (``OUT_labels``,
            :mod:`mnist2db.labels.databases`) is written beside, under the same keys, and
            the two are placed together (and resumed together); ``entries()`` must be
            ``targets.entries()``.

    Raises:
        Mnist2dbError: a refusal (see the module docstring), no image readable, or the
            database cannot be written; the destination is then untouched.
    """

    progress = reporting(progress)
    started = time.perf_counter()
    out = os.fspath(out)
    root_bytes = os.fsencode(root)
    check_backend(backend)
    check_batch_size(batch_size)
    jobs = check_jobs(jobs)
    check_resize(resize, 1 if gray else 3)
    if encode_type and encode_type.lower() not in ENCODE_TYPES:
        raise ImageError(
            f"cannot encode images as {encode_type!r}: the types written as Caffe writes "
            f"them are {', '.join(ENCODE_TYPES)}"
        )
    work = RecordWork(root_bytes, not gray, resize, encoded or bool(encode_type), encode_type)
    done = labels_done = Committed(0, -1, None)

    kept: list[ListEntry] | None = []

    def checked() -> Iterator[ListEntry]:  # the entries, kept as they are checked, while few
        nonlocal kept
        for entry in entries():
            if kept is not None:
                if len(kept) < KEPT_ENTRIES:
                    kept.append(entry)
                else:
                    kept = None
            yield entry

    def todo() -> Iterator[ListEntry]:  # the entries the run writes (after a resumed run's)
        if kept is not None and done.last_line < 0:
            yield from kept  # all of them, as the check kept them
            return
        for entry in entries() if kept is None else kept:
            if entry.line > done.last_line:
                yield entry

    # The workers fork first (before the database is opened, and before any decoder is
    # loaded: this process needs none), and load their decoders while the list is checked;
    # more than a few load them once, here, before the fork (shared_decoders).
    warm = work.warm_up(_first(entries))
    preload, warm = (warm, None) if shared_decoders(jobs) else (None, warm)
    with OrderedDecoding(todo(), work, root_bytes, jobs, preload=preload, releases=True,
                         keys=image_key, warm=warm) as decoded:  # fmt: skip
        digest = EntryDigest()
        total = check_entries(
            checked(),
            root=root_bytes,
            backend=backend,
            encoded=encoded,
            encode_type=encode_type,
            resize=resize,
            where=where,
            digest=digest,
        )
        plan = {"root": os.fsdecode(root_bytes), "list": where, "entries": digest.hexdigest(),
                "lines": total, "backend": backend, "gray": gray,
                "resize": list(resize) if resize else None, "encoded": encoded,
                "encode_type": encode_type, "check_size": check_size, "seed": seed,
                "width": None if targets is None else targets.width,
                "targets": None if targets is None else targets.digest(),
                "staged": None, "labels_staged": None, **owner_fields()}  # fmt: skip
        run = find_staged_run(out) if resume else None
        if resume and run is None:
            raise Mnist2dbError(
                f"{out}: --resume: no staged run of it to continue (a killed conversion leaves "
                f"{temp_prefix(os.path.basename(os.path.normpath(out)))}PID-… beside it)"
            )
        outs = [out] if targets is None else [out, labels_path(out)]
        adopt: list[str | None] = [None if run is None else run.path, None]
        if run is not None:
            from mnist2db.imageset.staged_checks import check_staged_database, check_staged_labels

            check_plan(out, run, plan)
            done = check_staged_database(run, backend)
            check_inputs(out, run, root_bytes, entries() if kept is None else kept, done.records)
            if targets is not None:  # the label database the killed run began beside, if any
                adopt[1] = find_staged_labels(out, outs[1], run.path)
                if adopt[1] is not None:
                    labels_done = check_staged_labels(run, adopt[1], backend)
        elif on_stale is not None:
            for stale in stale_staging(out):
                on_stale(stale)
        if on_start is not None:
            on_start(total)
        skipped: list[Skipped] = []
        state: dict[str, Any] = {"count": done.records, "shape": None, "mixed": False}

        def skip(entry: ListEntry, reason: str) -> None:
            gone = Skipped(entry, reason)
            skipped.append(gone)
            if on_skip is not None:
                on_skip(gone)

        first = None
        if done.first_key is not None:
            # The first record's image again, for its shape (--check_size, the summary).
            entry = ListEntry(int(done.first_key[:8]), done.first_key[9:], 0)
            shape = attempt(work, root_bytes, entry)
            if not isinstance(shape, str):
                first = (entry, shape[1])
                state["shape"] = shape[1]
        labels = None
        staged: Any = (
            staged_database(out, backend, overwrite=overwrite, inputs=list(inputs),
                            adopt=adopt[0])
            if targets is None
            # A label database beside: the two staged and placed together.
            else staged_databases(outs, backend, overwrite=overwrite, inputs=list(inputs),
                                  adopt=adopt)
        )  # fmt: skip
        with staged as staged_paths:
            stagings = [staged_paths] if targets is None else staged_paths
            staging = stagings[0]
            plan["staged"] = initial_identity(staging, backend, done)
            if targets is not None:
                plan["labels_staged"] = initial_identity(stagings[1], backend, labels_done)
            write_plan(staging, plan)
            batches = record_batches(decoded.runs(), check_size, batch_size, state, skip,
                                     where, first, decoded.release)  # fmt: skip
            if backend == "lmdb":
                batches = _unmapping(batches, os.path.join(staging, "data.mdb"))
            batches = recording_batches(batches, staging, plan, backend, done)

            def report(written: int, total: int) -> None:
                progress(done.records + written, total)

            write_database(backend, staging, 4096, batches, total, report, keyed=True,
                           existing=run is not None, resumable=True,
                           committed=(done.records, done.last_key),
                           before_commit=InputRecorder(staging, root_bytes, done.records))  # fmt: skip
            if not state["count"]:
                raise ImageError(
                    f"{where}: no image could be read"
                    + (f" (the first: {skipped[0].reason})" if skipped else " (it lists none)")
                    + "; nothing written"
                )
            if targets is not None:  # under the keys just written, whatever was skipped
                from mnist2db.labels.databases import write_label_database

                labels = write_label_database(backend, staging, stagings[1], targets, outs[1],
                                              batch_size=batch_size,
                                              committed=labels_done.records,
                                              last_key=labels_done.last_key,
                                              recorded=lambda batches: recording_batches(
                                                  batches, staging, plan, backend, labels_done,
                                                  field="labels_staged", database=stagings[1]))  # fmt: skip
            if metadata is not None:
                source = {**metadata.get("source", {}), "items": total}
                write_metadata(staging, {**metadata, "source": source,
                                         "records": state["count"]}, out)  # fmt: skip
            remove_plan(staging)
            remove_saved_states(stagings)
    return ImagesetResult(
        path=out,
        backend=backend,
        count=state["count"],
        lines=total,
        skipped=tuple(skipped),
        shape=None if state["mixed"] or encoded or encode_type else state["shape"],
        seconds=time.perf_counter() - started,
        labels=labels,
    )


def _first(entries: Entries) -> ListEntry | None:
    """The first entry ``entries()`` gives (the rest not read), or None."""
    listed = iter(entries())
    try:
        return next(listed, None)
    finally:
        close = getattr(listed, "close", None)
        if close is not None:
            close()


def _unmapping(batches: Iterator[list[tuple[bytes, bytes]]], path: str) -> Iterator[Any]:
    """``batches``, and after each is written, LMDB's map of ``path`` let go of the pages it
    touched: the kernel maps the file's pages around each one LMDB reads (64 KiB at a time),
    many of them the records just written, and the resident set would grow with the
    database (100 MiB at 50,000 photos, GiBs at ImageNet's size). They stay in the page
    cache; only this process's mapping of them is dropped (Linux; elsewhere nothing).
    Every :data:`RELEASE_EVERY` batches: reading ``/proc/self/maps`` takes the kernel ~3 ms,
    and a batch's own pages are a few hundred KiB."""
    target = os.path.realpath(path)
    for count, batch in enumerate(batches, 1):
        yield batch
        if count % RELEASE_EVERY == 0:
            release_mapped_pages(target)
    release_mapped_pages(target)


def release_mapped_pages(path: str) -> None:
    """Drop this process's mapping of the file at ``path`` (its real path) from its resident
    set: the pages stay in the page cache, and a read maps them again."""
    name = os.fsencode(path)
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        with open("/proc/self/maps", "rb") as maps:
            spans = [line.split(None, 1)[0] for line in maps if line.rstrip().endswith(name)]
        for span in spans:
            start, end = (int(x, 16) for x in span.split(b"-"))
            madvise(start, end - start, _MADV_DONTNEED)  # the pages stay in the page cache
    except (OSError, AttributeError, ValueError):
        pass  # not Linux: nothing to drop, or nothing known about it


_MADV_DONTNEED = 4


#: Above this many workers the decoders (numpy, OpenCV or Pillow: ~30 MiB of pages a
#: process) are loaded once, in this process before the fork, their pages shared by every
#: worker (copy-on-write); up to it each worker loads its own as it starts, in parallel with
#: the list's check (the start is shorter, and two private copies cost little).
SHARED_DECODERS_ABOVE = 2


def shared_decoders(jobs: int) -> bool:
    """Whether ``jobs`` workers share decoders loaded before their fork."""
    return jobs > SHARED_DECODERS_ABOVE


def check_jobs(jobs: int | None) -> int:
    """The worker count ``--jobs`` asks for (None: the default; 0: none).

    Raises:
        ArgumentError: a negative count.
    """
    if jobs is None:
        return default_jobs()
    if jobs < 0:
        raise ArgumentError(f"--jobs must be 0 or more, got {jobs}")
    return jobs
