"""A class-per-folder tree of images (torchvision's ``ImageFolder`` convention) as a list.

``ROOT/<class>/**/<image>``: the classes are the folders directly under ROOT, sorted by
name, labelled 0, 1, ... in that order; each class's images are found walking its folder
(links followed, folders and files in name order), kept when their extension is one of
torchvision's image extensions (any case). Hidden folders and files (a leading ``.``) are
skipped and counted, so that ``.git`` or ``.ipynb_checkpoints`` never become a class.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mnist2db.errors import ImageError, printable
from mnist2db.formats.image_list import ListEntry

#: torchvision.datasets.folder.IMG_EXTENSIONS
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ClassTree(NamedTuple):
    """What :func:`scan_class_folders` found: ``classes`` (names, label order), ``entries``
    (paths relative to the root, numbered from 0), ``hidden`` (hidden folders and files
    skipped, relative paths), ``others`` (files of other extensions skipped)."""

    classes: tuple[str, ...]
    entries: tuple[ListEntry, ...]
    hidden: tuple[str, ...]
    others: int


def scan_class_folders(root: str | os.PathLike[str]) -> ClassTree:
    """The images of the class-folder tree at ``root``, in ImageFolder's order.

    Raises:
        ImageError: ``root`` is not a directory, holds no class folder, or a class folder
            holds no image.
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
    others = 0
    for label, name in enumerate(classes):
        start = len(entries)
        base = os.path.join(top, name)
        walked = []
        for folder, subfolders, files in os.walk(base, followlinks=True):
            relative = os.path.relpath(folder, top)
            hidden.extend(os.path.join(relative, s) for s in subfolders if s.startswith("."))
            subfolders[:] = [s for s in subfolders if not s.startswith(".")]
            walked.append((folder, relative, files))
        # torchvision sorts os.walk's tuples: folders in the order of their paths.
        for _, relative, files in sorted(walked):
            for file in sorted(files):
                if file.startswith("."):
                    hidden.append(os.path.join(relative, file))
                elif file.lower().endswith(IMAGE_EXTENSIONS):
                    path = os.fsencode(os.path.join(relative, file))
                    entries.append(ListEntry(len(entries), path, label))
                else:
                    others += 1
        if len(entries) == start:
            raise ImageError(
                f"{printable(base)}: class folder {printable(name)!r} holds no image "
                f"({', '.join(IMAGE_EXTENSIONS)})"
            )
    return ClassTree(tuple(classes), tuple(entries), tuple(hidden), others)
