"""``mnist2db imageset``: a user's own images, from a list or a class-folder tree, to Caffe
records (:func:`mnist2db.imageset.to_database.write_imageset`) or to an MNIST IDX pair.

With a list (Caffe's ``PATH LABEL`` lines, relative to ROOT) the records are exactly
``convert_imageset``'s. Without one, ROOT is a class-folder tree
(:mod:`mnist2db.imageset.class_folders`); the classes and the list generated from it are
written beside the output (``OUT.classes.txt``: one class name a line, in label order;
``OUT.list.txt``: the list, which ``--list`` takes to repeat the run). ``seed`` shuffles
the entries repeatably (the permutation of :func:`mnist2db.selection.permutation`); the seed
and the options are recorded in the database's ``mnist2db.json``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from mnist2db.errors import ArgumentError, OutputError
from mnist2db.formats.lists.image_list import ImageList, ListEntry, ListIndex, list_line
from mnist2db.imageset.class_folders import scan_class_folders
from mnist2db.imageset.resume import staged_seed
from mnist2db.imageset.to_database import ImagesetResult, Skipped, write_imageset
from mnist2db.progress import Progress
from mnist2db.recipe import imageset_metadata
from mnist2db.selection import fresh_seed, permutation
from mnist2db.storage.file_placement import check_file_target
from mnist2db.storage.files import AtomicFile

if TYPE_CHECKING:
    from mnist2db.labels.databases import TargetSource

#: What ``to`` may be: a database, or an MNIST IDX pair.
OUTPUTS = ("db", "idx")
#: What ``encoded`` may be: each file's own bytes, or a type every image is encoded as.
ENCODED = ("file", "png", "jpg", "bmp")


class OwnImagesResult(NamedTuple):
    """What :func:`convert_images` wrote: the records' ``result``, the ``seed`` of the
    shuffle (None: list order), the class names and the ``extra`` files written beside (a
    class-folder tree), and the ``hidden`` folders and files skipped in it, and the links to
    folders already walked (``repeated``)."""

    result: ImagesetResult
    seed: int | None
    classes: tuple[str, ...]
    extra: tuple[str, ...]
    hidden: tuple[str, ...]
    repeated: tuple[str, ...] = ()


def convert_images(
    root: str,
    out: str,
    *,
    listing: str | None = None,
    to: str = "db",
    backend: str = "lmdb",
    gray: bool = False,
    resize: tuple[int, int] | None = None,
    encoded: str | None = None,
    check_size: bool = False,
    shuffle: bool = False,
    seed: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    on_skip: Callable[[Skipped], None] | None = None,
    jobs: int | None = None,
    resume: bool = False,
    on_stale: Callable[[str], None] | None = None,
    labels: str | None = None,
    values: int | None = None,
) -> OwnImagesResult:
    """Write the images under ``root`` to ``out`` (a database, or with ``to="idx"`` the
    prefix of an IDX pair).

    Args:
        listing: a Caffe list file; None: ``root`` is a class-folder tree.
        encoded: ``"file"`` (each file's own bytes, Caffe's ``--encoded``), or a type to
            encode every image as (``png``, ``jpg``, ``bmp``); None: raw pixels.
        shuffle, seed: a random order; ``seed`` repeats it (None: a fresh seed).
        jobs: worker processes decoding (None: one per processor this process may use).
        resume, on_stale: see :func:`mnist2db.imageset.to_database.write_imageset` (a resumed
            shuffle given no seed takes the staged run's).
        labels: a label table with a header (CSV, whitespace, CelebA's layout) naming
            the images and their targets, instead of ``listing``; a label database
            ``OUT_labels`` is written beside (:mod:`mnist2db.labels.databases`).
        values: ``listing``'s lines are ``PATH V1 … VN`` with N ``values`` (0: N taken
            from the first line); a label database is written beside, as for ``labels``.

    Raises:
        Mnist2dbError: see :func:`mnist2db.imageset.to_database.write_imageset` and
            :func:`mnist2db.imageset.to_idx.write_imageset_idx`; nothing is then written.
    """

    if to not in OUTPUTS:
        raise ArgumentError(f"unknown target {to!r}: expected one of {', '.join(OUTPUTS)}")
    if to == "idx" and encoded is not None:
        raise ArgumentError("an IDX file holds raw grey pixels: --encoded writes a database")
    if shuffle and seed is None and resume and to == "db":
        staged = staged_seed(out)  # a resumed shuffle repeats the staged run's order
        seed = staged if staged >= 0 else None
    targets = None
    if labels is not None or values is not None:
        targets = _targets(listing, labels, values, to, shuffle, seed)
        seed = targets.seed
    base = os.fsencode(root)
    prefix = base if not base or base.endswith(b"/") else base + b"/"
    classes: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    repeated: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    entries: list[ListEntry] | None = None
    if targets is not None:
        where = targets.source.table.path
    elif listing is None:
        tree = scan_class_folders(root)
        classes, hidden, repeated = tree.classes, tree.hidden, tree.repeated
        entries = list(tree.entries)
        extra = (f"{os.path.normpath(out)}.classes.txt", f"{os.path.normpath(out)}.list.txt")
        for path in extra:
            check_file_target(path, overwrite, [root])
        where = f"{root} (class folders)"
    else:
        entries = None
        where = listing
    listed_once = ImageList(listing or "")  # a pipe is read once, whatever the passes
    fixed = entries
    shuffled: Callable[[], Iterator[ListEntry]] | None = None
    lines = -1 if fixed is None else len(fixed)
    if targets is not None:
        pass
    elif shuffle:
        # An index and the order, not the entries a second time: entry k of the shuffle is
        # entry order[k], read again (from the tree's entries, or by offset from the list).
        if seed is None:
            seed = fresh_seed()
        if fixed is not None:
            order = permutation(seed, len(fixed))
            shuffled = partial(_in_order, fixed, order)
        else:
            index = ListIndex(listed_once)
            order = permutation(seed, len(index))
            shuffled = partial(index.entries, order)
        lines = len(order)
    else:
        seed = None

    def source() -> Any:
        if targets is not None:
            return targets.source.entries()
        if shuffled is not None:
            return shuffled()
        return fixed if fixed is not None else listed_once()

    inputs = [root] + ([listing] if listing else []) + ([labels] if labels else [])
    if to == "idx":
        from mnist2db.imageset.to_idx import write_imageset_idx

        result = write_imageset_idx(prefix, source, out, resize=resize, overwrite=overwrite,
                                    where=where, inputs=inputs, progress=progress,
                                    on_skip=on_skip, jobs=jobs)  # fmt: skip
    else:
        options = {"gray": gray, "resize": list(resize) if resize else None,
                   "encode_type": encoded, "check_size": check_size}  # fmt: skip
        metadata = imageset_metadata(root=root, listing=labels or listing or "class folders",
                                     lines=lines,
                                     options=options, seed=seed)  # fmt: skip
        result = write_imageset(
            prefix, source, out, backend, gray=gray, resize=resize,
            encoded=encoded == "file", encode_type=None if encoded in (None, "file") else encoded,
            check_size=check_size, overwrite=overwrite, where=where, inputs=inputs,
            metadata=metadata, progress=progress, on_skip=on_skip, jobs=jobs, resume=resume,
            seed=seed, on_stale=on_stale, targets=None if targets is None else targets.source,
        )  # fmt: skip
    if fixed is not None and listing is None:
        _write_beside(extra, classes, source())
    return OwnImagesResult(result, seed, classes, extra, hidden, repeated)


class _Targets(NamedTuple):
    source: TargetSource
    seed: int | None


def _targets(
    listing: str | None, labels: str | None, values: int | None, to: str, shuffle: bool,
    seed: int | None,
) -> _Targets:  # fmt: skip
    """The label table the options name, in the order the records take (a shuffle's)."""
    if to == "idx":
        raise ArgumentError("an idx1 label file holds one label 0-255: labels beyond one "
                            "go to a database (--to db)")  # fmt: skip
    if labels is not None and (listing is not None or values is not None):
        raise ArgumentError("--labels names the images itself: give it, or --list (with "
                            "--values), not both")  # fmt: skip
    if labels is None and listing is None:
        raise ArgumentError("--values reads a --list of 'PATH V1 … VN' lines: give --list")
    if values is not None and values < 0:
        raise ArgumentError(f"--values must be 0 (from the first line) or more, got {values}")
    from mnist2db.formats.lists.label_table import open_label_table
    from mnist2db.labels.databases import TargetSource

    if labels is not None:
        table = open_label_table(labels, header=True)
    else:
        table = open_label_table(listing or "", header=False, width=values or None)
    order = None
    if shuffle:
        if seed is None:
            seed = fresh_seed()
        order = permutation(seed, TargetSource(table).count())
    return _Targets(TargetSource(table, order), seed if shuffle else None)


def _in_order(entries: list[ListEntry], order: Iterable[int]) -> Iterator[ListEntry]:
    """Entry ``order[k]`` of ``entries`` as entry ``k``."""
    for number, i in enumerate(order):
        entry = entries[i]
        yield ListEntry(number, entry.path, entry.label)


def _write_beside(
    paths: tuple[str, ...], classes: tuple[str, ...], entries: Iterable[ListEntry]
) -> None:
    """The class names and the generated list (``entries``, in line order), each written
    whole or not at all."""

    texts = (
        "".join(f"{name}\n" for name in classes).encode("utf-8", "surrogateescape"),
        b"".join(map(list_line, entries)),
    )
    for path, text in zip(paths, texts, strict=True):
        try:
            with AtomicFile(path) as target:
                target.write(text)
                target.commit()
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror}") from None
