"""The start-up budget of the fast paths, kept in this one module.

A plain ``mnist2db convert`` (the click-free path in :mod:`mnist2db.__main__`) and Caffe's
drop-in ``convert_mnist_data`` (:mod:`mnist2db.caffe_tools.drop_ins`) convert MNIST's training set in
~0.15 s. Importing ``typing`` (~10 ms), ``dataclasses`` (~15 ms: it imports ``inspect``),
``tempfile`` (~10 ms), ``click`` (~25 ms), protobuf or numpy (~60 ms) would be a visible
share of that, so the modules on those paths do without them (``tempfile``:
:func:`mnist2db.storage.files.mkdtemp_beside`; protobuf: :mod:`mnist2db.formats.datum`'s own encoder);
``tests/test_startup.py`` fails when one of them is imported there. Every other module
uses ``typing`` and ``dataclasses`` plainly.

The modules on the fast paths take from here, instead of from ``typing``:

* ``TYPE_CHECKING``: False at run time; type checkers read any name ``TYPE_CHECKING`` as true.
* ``NamedTuple``: ``typing.NamedTuple`` for type checkers; at run time the same class body
  becomes a ``collections.namedtuple`` subclass (fields from its annotations, defaults
  from its values, methods and properties kept), so the checked definition is the one
  that runs.
* ``Protocol``: ``typing.Protocol`` for type checkers; ``object`` at run time.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False

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


__all__ = ["TYPE_CHECKING", "NamedTuple", "Protocol"]
