"""The fast paths, named once: the modules Caffe's drop-ins may load.

Caffe's drop-in ``convert_mnist_data`` (:mod:`mnist2db.caffe_tools.drop_ins`) converts
MNIST's training set in ~0.15 s, so the modules in :data:`FAST_PATH` import ``click``,
``dataclasses``, ``tempfile``, protobuf and numpy (10-80 ms each) only inside the functions
that need them (``tempfile``: :func:`mnist2db.storage.files.mkdtemp_beside`; protobuf:
:mod:`mnist2db.formats.datum`'s own encoder). Caffe's drop-in ``convert_imageset`` on a
list of PNG files runs on :data:`FAST_PATH` and :data:`IMAGESET_PATH`, and loads no numpy,
Pillow or OpenCV in its own process (its workers load Pillow's core, and the rest when an
image needs it). Every other module imports what it uses at its top, as ordinary Python.
``tests/test_fastpath.py`` runs each in a fresh interpreter and fails when it loads a module
outside its set or any of the costly ones.
"""

from __future__ import annotations

#: Every mnist2db module Caffe's drop-in ``convert_mnist_data`` (LMDB or LevelDB) may load;
#: anything beyond (numpy for the conversion options, the readers for --overwrite) is loaded
#: by the function that needs it.
FAST_PATH = frozenset(
    {
        "mnist2db",
        "mnist2db.caffe_tools",
        "mnist2db.caffe_tools.drop_ins",
        "mnist2db.caffe_tools.frame",
        "mnist2db.caffe_tools.gflags",
        "mnist2db.caffe_tools.glog",
        "mnist2db.conversion",
        "mnist2db.errors",
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
        "mnist2db.storage.db_staging",
        "mnist2db.storage.file_placement",
        "mnist2db.storage.files",
        "mnist2db.storage.metadata",
        "mnist2db.storage.record_digest",
        "mnist2db.storage.targets",
        "mnist2db.storage.writers",
        "mnist2db.version",
    }
)

#: The mnist2db modules beyond :data:`FAST_PATH` that ``convert_imageset`` loads in its own
#: process for a list of PNG files.
IMAGESET_PATH = frozenset(
    {
        "mnist2db.caffe_tools.convert_imageset",
        "mnist2db.formats.image_input",
        "mnist2db.formats.image_list",
        "mnist2db.formats.image_types",
        "mnist2db.formats.opencv",
        "mnist2db.formats.plain_png",
        "mnist2db.formats.text_lines",
        "mnist2db.images",
        "mnist2db.images.datum_records",
        "mnist2db.images.process_setup",
        "mnist2db.images.record_batches",
        "mnist2db.images.record_work",
        "mnist2db.images.result_ring",
        "mnist2db.images.resume",
        "mnist2db.images.worker_loop",
        "mnist2db.images.worker_messages",
        "mnist2db.images.workers",
    }
)
