"""The fast paths, named once: the modules a plain conversion may load, and what they use
instead of ``typing``.

A plain ``mnist2db convert`` (the click-free path in :mod:`mnist2db.__main__`) and Caffe's
drop-in ``convert_mnist_data`` (:mod:`mnist2db.caffe_tools.drop_ins`) convert MNIST's
training set in ~0.15 s. Importing ``typing`` (~10 ms), ``dataclasses`` (~15 ms: it imports
``inspect``), ``tempfile`` (~10 ms), ``click`` (~25 ms), protobuf or numpy (~60 ms) would be
a visible share of that. So the modules in :data:`FAST_PATH` import those only inside the
functions that need them (``tempfile``: :func:`mnist2db.storage.files.mkdtemp_beside`;
protobuf: :mod:`mnist2db.formats.datum`'s own encoder), and take from here instead of
``typing``:

* ``TYPE_CHECKING``: False at run time; type checkers read any name ``TYPE_CHECKING`` as true.
* ``NamedTuple``: ``typing.NamedTuple`` for type checkers; at run time the same class body
  becomes a ``collections.namedtuple`` subclass (fields from its annotations, defaults
  from its values, methods and properties kept), so the checked definition is the one
  that runs.
* ``Protocol``: ``typing.Protocol`` for type checkers; ``object`` at run time.

Every other module imports what it uses at its top, as ordinary Python.
``tests/test_fastpath.py`` runs each fast path in a fresh interpreter and fails when it
loads a module outside :data:`FAST_PATH` or any of the costly ones.
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
        "mnist2db.formats.deflate",
        "mnist2db.formats.idx",
        "mnist2db.formats.idx_reader",
        "mnist2db.formats.png",
        "mnist2db.formats.protowire",
        "mnist2db.interrupt",
        "mnist2db.progress",
        "mnist2db.records",
        "mnist2db.storage",
        "mnist2db.storage.backends",
        "mnist2db.storage.db_journal",
        "mnist2db.storage.db_staging",
        "mnist2db.storage.files",
        "mnist2db.storage.metadata",
        "mnist2db.storage.targets",
        "mnist2db.version",
    }
)

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
    from typing import Protocol as Protocol
else:
    Protocol = object

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, namespace):
            if namespace.get("_root", False):
                return super().__new__(mcls, name, bases, namespace)
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[f] for f in fields if f in namespace]
            base = collections.namedtuple(
                name, fields, defaults=defaults, module=namespace.get("__module__")
            )
            body = {
                key: value
                for key, value in namespace.items()
                if key not in fields and key != "__annotations__"
            }
            body["__slots__"] = ()
            return type(name, (base,), body)

    class NamedTuple(metaclass=_NamedTupleMeta):
        _root = True
