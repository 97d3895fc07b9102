"""A class-per-folder tree of images (torchvision's ``ImageFolder`` convention) as a list.

``ROOT/<class>/**/<image>``: the classes are the folders directly under ROOT, sorted by
name, labelled 0, 1, ... in that order; each class's images are found walking its folder
(links followed, folders and files in name order), kept when their extension is one of
torchvision's image extensions (any case). Hidden folders and files (a leading ``.``) are
skipped and counted, so that ``.git`` or ``.ipynb_checkpoints`` never become a class.

Links are followed, but each folder is walked once per class (known by its device and
inode): a link back to a folder above it (a loop, which ``os.walk`` follows until the path
is too long, exponentially with two such links) or a second link to a folder already
walked is skipped and reported. A name that no list line can hold (a newline in it, a
space at an end) is refused, naming it: the list written beside the output must read back.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mnist2db.errors import ImageError, printable
from mnist2db.formats.lists.image_list import ListEntry, listable

#: torchvision.datasets.folder.IMG_EXTENSIONS
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ClassTree(NamedTuple):
    """What :func:`scan_class_folders` found: ``classes`` (names, label order), ``entries``
    (paths relative to the root, numbered from 0), ``hidden`` (hidden folders and files
    skipped, relative paths), ``others`` (files of other extensions skipped), ``repeated``
    (links to folders already walked, skipped: loops and second links)."""

    classes: tuple[str, ...]
    entries: tuple[ListEntry, ...]
    hidden: tuple[str, ...]
    others: int
    repeated: tuple[str, ...] = ()


def _unlistable(path: str) -> ImageError:
    return ImageError(
        f"{printable(repr(path)[1:-1])}: a name no list line can hold (a newline, or a space "
        "or tab at an end): rename it, or hide it with a leading '.'"
    )


def scan_class_folders(root: str | os.PathLike[str]) -> ClassTree:
    """The images of the class-folder tree at ``root``, in ImageFolder's order.

    Raises:
        ImageError: ``root`` is not a directory, holds no class folder, a class folder
            holds no image, or a name cannot be written to a list.
    """
    top = os.fspath(root)
    try:
        found = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError as exc:
        raise ImageError(f"{top}: cannot list the class folders: {exc.strerror}") from None
    hidden = [e.name for e in found if e.name.startswith(".")]
    classes = [e.name for e in found if e.is_dir() and not e.name.startswith(".")]
    if not classes:
        raise ImageError(
            f"{top}: holds no class folder (ROOT/<class>/<image>; or give --list LIST)"
        )
    entries: list[ListEntry] = []
    repeated: list[str] = []
    others = 0
    for label, name in enumerate(classes):
        if "\n" in name or "\r" in name:
            raise _unlistable(os.path.join(top, name))
        start = len(entries)
        base = os.path.join(top, name)
        walked = _walk_once(base, top, hidden, repeated)
        # torchvision sorts os.walk's tuples: folders in the order of their paths.
        for _, relative, files in sorted(walked):
            for file in sorted(files):
                if file.startswith("."):
                    hidden.append(os.path.join(relative, file))
                elif file.lower().endswith(IMAGE_EXTENSIONS):
                    path = os.fsencode(os.path.join(relative, file))
                    if not listable(path):
                        raise _unlistable(os.path.join(top, relative, file))
                    entries.append(ListEntry(len(entries), path, label))
                else:
                    others += 1
        if len(entries) == start:
            raise ImageError(
                f"{printable(base)}: class folder {printable(name)!r} holds no image "
                f"({', '.join(IMAGE_EXTENSIONS)})"
            )
    return ClassTree(tuple(classes), tuple(entries), tuple(hidden), others, tuple(repeated))


def _walk_once(
    base: str, top: str, hidden: list[str], repeated: list[str]
) -> list[tuple[str, str, list[str]]]:
    """``os.walk(base, followlinks=True)`` as ``(folder, relative to top, files)``, each
    folder (device, inode) once: the links to one already walked are added to
    ``repeated``, hidden folders to ``hidden``."""
    seen: set[tuple[int, int]] = set()
    identity = _identity(base)
    if identity is not None:
        seen.add(identity)
    walked = []
    for folder, subfolders, files in os.walk(base, followlinks=True):
        relative = os.path.relpath(folder, top)
        hidden.extend(os.path.join(relative, s) for s in subfolders if s.startswith("."))
        kept = []
        for sub in sorted(subfolders):  # the first link to a folder, in name order, walks it
            if sub.startswith("."):
                continue
            identity = _identity(os.path.join(folder, sub))
            if identity is not None and identity in seen:
                repeated.append(os.path.join(relative, sub))
                continue
            if identity is not None:
                seen.add(identity)
            kept.append(sub)
        subfolders[:] = kept
        walked.append((folder, relative, files))
    return walked


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
