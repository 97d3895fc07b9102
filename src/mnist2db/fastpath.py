"""The fast paths, named once: the modules a plain conversion may load, and what they use
instead of ``typing``.

A plain ``mnist2db convert`` (the click-free path in :mod:`mnist2db.__main__`) and Caffe's
drop-in ``convert_mnist_data`` (:mod:`mnist2db.caffe_tools.drop_ins`) convert MNIST's
training set in ~0.15 s. Importing ``typing`` (~10 ms), ``dataclasses`` (~15 ms: it imports
``inspect``), ``tempfile`` (~10 ms), ``click`` (~25 ms), protobuf or numpy (~60 ms) would be
a visible share of that. So the modules in :data:`FAST_PATH` import those only inside the
functions that need them (``tempfile``: :func:`mnist2db.storage.files.mkdtemp_beside`;
protobuf: :mod:`mnist2db.formats.datum.message`'s own encoder), and take from here instead of
``typing``:

* ``TYPE_CHECKING``: False at run time; type checkers read any name ``TYPE_CHECKING`` as true.
* ``NamedTuple`` and ``named_tuple``: a class written ``@named_tuple class X(NamedTuple):``
  is ``typing.NamedTuple``'s for type checkers (``named_tuple`` returns it as it is); at
  run time ``NamedTuple`` is ``object`` and ``named_tuple`` makes the class body a
  ``collections.namedtuple`` subclass (fields from its annotations, defaults from its
  values, methods and properties kept), so the checked definition is the one that runs.
* ``Protocol``: ``typing.Protocol`` for type checkers; ``object`` at run time.

Caffe's drop-in ``convert_imageset`` on a list of PNG files (MNIST-size images: its start is
most of its time) runs on :data:`FAST_PATH` and :data:`IMAGESET_PATH`, whose modules use the
same three names instead of ``typing``, and loads no numpy, Pillow or OpenCV in its own
process (its workers load Pillow's core, and the rest when an image needs it).

Every other module imports what it uses at its top, as ordinary Python.
``tests/test_fastpath.py`` runs each fast path in a fresh interpreter and fails when it
loads a module outside its set or any of the costly ones.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False

#: Every mnist2db module a plain ``mnist2db convert`` (LMDB or LevelDB) and Caffe's drop-in
#: ``convert_mnist_data`` may load; anything beyond (numpy for the conversion options, the
#: readers for --overwrite) is loaded by the function that needs it.
FAST_PATH = frozenset(
    {
        "mnist2db",
        "mnist2db.__main__",
        "mnist2db.caffe_tools",
        "mnist2db.caffe_tools.drop_ins",
        "mnist2db.caffe_tools.frame",
        "mnist2db.caffe_tools.gflags",
        "mnist2db.caffe_tools.glog",
        "mnist2db.conversion",
        "mnist2db.errors",
        "mnist2db.fastpath",
        "mnist2db.formats",
        "mnist2db.formats.datum",
        "mnist2db.formats.datum.message",
        "mnist2db.formats.datum.frames",
        "mnist2db.formats.idx",
        "mnist2db.formats.idx.header",
        "mnist2db.formats.idx.reader",
        "mnist2db.formats.png",
        "mnist2db.formats.png.deflate",
        "mnist2db.formats.png.encoder",
        "mnist2db.formats.protowire",
        "mnist2db.interrupt",
        "mnist2db.progress",
        "mnist2db.recipe",
        "mnist2db.selection",
        "mnist2db.storage",
        "mnist2db.storage.databases",
        "mnist2db.storage.databases.backends",
        "mnist2db.storage.databases.writers",
        "mnist2db.storage.file_placement",
        "mnist2db.storage.db_staging",
        "mnist2db.storage.destinations",
        "mnist2db.storage.files",
        "mnist2db.storage.owners",
        "mnist2db.storage.record_digest",
        "mnist2db.version",
    }
)

#: The mnist2db modules beyond :data:`FAST_PATH` that ``convert_imageset`` loads in its own
#: process for a list of PNG files.
IMAGESET_PATH = frozenset(
    {
        "mnist2db.caffe_tools.convert_imageset",
        "mnist2db.formats.imdecode",
        "mnist2db.formats.imdecode.image_file",
        "mnist2db.formats.imread",
        "mnist2db.formats.imread.cv2_wheel",
        "mnist2db.formats.imread.encode_types",
        "mnist2db.formats.lists",
        "mnist2db.formats.lists.image_list",
        "mnist2db.formats.lists.text_lines",
        "mnist2db.formats.plain_png",
        "mnist2db.imageset",
        "mnist2db.imageset.batches",
        "mnist2db.imageset.resume",
        "mnist2db.imageset.to_database",
        "mnist2db.imageset.work",
        "mnist2db.imageset.workers",
        "mnist2db.imageset.workers.loop",
        "mnist2db.imageset.workers.messages",
        "mnist2db.imageset.workers.pool",
        "mnist2db.imageset.workers.result_ring",
        "mnist2db.process_setup",
        "mnist2db.storage.digest_state",
    }
)

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
    from typing import Protocol as Protocol
    from typing import TypeVar

    _Class = TypeVar("_Class", bound=type)

    def named_tuple(cls: _Class) -> _Class:
        return cls

else:
    NamedTuple = Protocol = object

    def named_tuple(cls):
        """``cls``, a ``NamedTuple``-style class (annotated fields, defaults, methods), as a
        ``collections.namedtuple`` subclass with the same fields, defaults and methods."""
        body = dict(vars(cls))
        fields = list(body.pop("__annotations__", {}))
        defaults = [body.pop(name) for name in fields if name in body]
        for name in ("__dict__", "__weakref__"):
            body.pop(name, None)
        body["__slots__"] = ()
        base = collections.namedtuple(
            cls.__name__, fields, defaults=defaults, module=cls.__module__
        )
        return type(cls.__name__, (base,), body)
