"""The package's shape, kept by tests: no import circles, no private names across modules,
``__all__`` only on the public face, click only in the front ends, and the fast path's
modules named once (:data:`mnist2db.fastpath.FAST_PATH`).

The import graph is read from the source (every ``import`` and ``from … import`` of a
``mnist2db`` module, at module level or inside a function; those under ``if TYPE_CHECKING:``
are for type checkers and never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "mnist2db"
FRONT_ENDS = ("mnist2db.cli", "mnist2db.caffe_tools", "mnist2db.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {
        module_name(p): ast.parse(p.read_text(), str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
        if not p.name.endswith("_pb2.py")
    }


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def imports(tree: ast.Module, known: set[str]) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import of a mnist2db module that runs."""
    skip = _type_checking_nodes(tree)
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "mnist2db":
                continue
            names = [a.name for a in node.names]
            # "from mnist2db.formats.idx import header" imports the module mnist2db.formats.idx.header
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in known]
            found.extend((m, []) for m in submodules)
            rest = [n for n in names if f"{node.module}.{n}" not in known]
            if rest:
                found.append((node.module, rest))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names if a.name.startswith("mnist2db."))
    return found


def graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    return {name: {m for m, _ in imports(tree, known) if m != name} for name, tree in trees.items()}


def test_nothing_inside_imports_the_public_face() -> None:
    """``mnist2db`` (``__init__.py``) stands above every operation: a module inside that
    imports a name from it (``from mnist2db import __version__``) points up."""
    users = sorted(name for name, targets in graph().items() if "mnist2db" in targets)
    assert users == []


def test_there_are_no_import_circles() -> None:
    edges = graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert circles == []


#: The rooms: every package, and what it holds. A newcomer reads these names and knows
#: where a thing lives; a new package is added here with its one line.
ROOMS = {
    "mnist2db": "the public face; the operations, one module each; the ground floor",
    "mnist2db.cli": "the click front end, a module per group of commands",
    "mnist2db.caffe_tools": "the drop-ins for Caffe's tools",
    "mnist2db.fetch": "getting a dataset: catalog, transport, sink, manifest, archives",
    "mnist2db.exporting": "a database's records out again: --to idx, and what both others share",
    "mnist2db.exporting.image_files": "export --to files",
    "mnist2db.exporting.webdataset": "export --to webdataset",
    "mnist2db.imageset": "your own images to records or an IDX pair (imageset, convert_imageset)",
    "mnist2db.imageset.workers": "the decoding worker processes",
    "mnist2db.labels": "label databases: float values beside an image database",
    "mnist2db.reading": "the reading API: open_db, the datasets, their record decoders",
    "mnist2db.storage": "where outputs go and how they are placed: staging, files, the digest",
    "mnist2db.storage.databases": "LMDB and LevelDB: backends, writers, read handles, checks",
    "mnist2db.formats": "bytes on disk and in records, a room per family",
    "mnist2db.formats.idx": "IDX files",
    "mnist2db.formats.datum": "Caffe's Datum",
    "mnist2db.formats.png": "PNG written",
    "mnist2db.formats.imdecode": "image bytes within OpenCV's limits; PNG records decoded",
    "mnist2db.formats.imread": "image files read, resized, written as OpenCV does",
    "mnist2db.formats.lists": "Caffe's image lists, label tables, their line reader",
}
#: The most modules a room (a package but the top one) may hold, its __init__.py counted.
ROOM_SIZE = 12


def test_the_rooms_are_the_map() -> None:
    """Every package is a room named in :data:`ROOMS`, none a drawer of more than
    :data:`ROOM_SIZE` modules."""
    packages = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert packages == set(ROOMS)
    sizes = {
        module_name(p.parent / "__init__.py"): len(list(p.glob("*.py")))
        for p in {q.parent for q in PACKAGE.rglob("__init__.py")}
        if p != PACKAGE
    }
    assert {name: n for name, n in sizes.items() if n > ROOM_SIZE} == {}


def all_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Every mnist2db module ``tree`` imports, those for type checkers too."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module in known | {"mnist2db"}:
            for a in node.names:
                found.add(
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
    return found


def find_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk of ``edges`` meets."""
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return circles


def test_rooms_import_each_other_one_way() -> None:
    """Inside every package, its rooms (each subpackage taken whole, each module alone)
    import each other one way, the imports for type checkers counted: no circle of files
    and no arrow back up between rooms (formats/datum/ above formats/imdecode/ above
    formats/png/, never the other way)."""
    trees = modules()
    known = set(trees)
    circles = []
    for package in sorted(ROOMS):
        prefix = package + "."

        def room(name: str, prefix: str = prefix) -> str | None:
            if not name.startswith(prefix):
                return None
            return prefix + name[len(prefix) :].split(".")[0]

        edges: dict[str, set[str]] = {}
        for name, tree in trees.items():
            source = room(name)
            if source is None:
                continue
            for target in all_imports(tree, known):
                to = room(target)
                if to is not None and to != source:
                    edges.setdefault(source, set()).add(to)
        circles.extend(find_circles(edges))
    assert circles == []


#: The floors, top down: a module imports only from its own floor or the floors below.
FLOORS = [
    ("mnist2db.__main__", "mnist2db.cli", "mnist2db.caffe_tools"),
    (
        "mnist2db.conversion",
        "mnist2db.create",
        "mnist2db.siamese",
        "mnist2db.mean",
        "mnist2db.show",
        "mnist2db.render",
        "mnist2db.info",
        "mnist2db.verify",
        "mnist2db.selection",
        "mnist2db.recipe",
        "mnist2db.labels",
        "mnist2db.exporting",
        "mnist2db.imageset",
        "mnist2db.fetch",
        "mnist2db.datum_pb2",
    ),
    ("mnist2db.reading",),
    ("mnist2db.storage",),
    ("mnist2db.formats",),
    (
        "mnist2db.errors",
        "mnist2db.fastpath",
        "mnist2db.progress",
        "mnist2db.interrupt",
        "mnist2db.version",
        "mnist2db.thread_pool",
        "mnist2db.untrusted",
        "mnist2db.process_setup",
    ),
]


def floor_of(name: str) -> int | None:
    for floor, rooms in enumerate(FLOORS):
        if any(name == r or name.startswith(r + ".") for r in rooms):
            return floor
    return None


def test_no_import_runs_back_up() -> None:
    """The front ends, the operations, the reading API, storage, the formats, the ground
    floor: every module is on one floor and imports nothing above it (the public face
    ``mnist2db`` stands on none: nothing imports it)."""
    trees = modules()
    known = set(trees)
    unplaced = sorted(name for name in trees if name != "mnist2db" and floor_of(name) is None)
    up = sorted(
        f"{name} -> {target}"
        for name, tree in trees.items()
        if name != "mnist2db"
        for target in all_imports(tree, known)
        if target != "mnist2db" and (floor_of(target) or 0) < (floor_of(name) or 0)
    )
    assert (unplaced, up) == ([], [])


def test_no_module_uses_another_modules_private_name() -> None:
    trees = modules()
    known = set(trees)
    private = [
        f"{name} imports {module}.{n}"
        for name, tree in trees.items()
        for module, names in imports(tree, known)
        for n in names
        if n.startswith("_") and not n.startswith("__") and module != name
    ]
    # ... nor reaches one through a module it imported (``staging._checkpoint(...)``)
    for name, tree in trees.items():
        aliases = {
            a.asname or a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mnist2db")
            for a in node.names
            if f"{node.module}.{a.name}" in known
        }
        private.extend(
            f"{name} uses {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        )
    assert private == []


def test_all_only_on_the_public_face() -> None:
    declared = [
        name
        for name, tree in modules().items()
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    ]
    assert declared == ["mnist2db"]


def test_click_only_in_the_front_ends() -> None:
    users = []
    for name, tree in modules().items():
        if name.startswith(FRONT_ENDS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                if any(m.split(".")[0] == "click" for m in mods):
                    users.append(name)
    assert users == []


def test_the_library_flows_one_way() -> None:
    """Front ends -> operations -> formats and storage -> errors: nothing below the front
    ends imports them, and formats/ and storage/ import no operation."""
    lower = ("mnist2db.formats", "mnist2db.storage", "mnist2db.fetch")
    base = {
        "mnist2db.errors",
        "mnist2db.fastpath",
        "mnist2db.progress",
        "mnist2db.interrupt",
        "mnist2db.version",
        "mnist2db.thread_pool",
        "mnist2db.untrusted",
        "mnist2db.process_setup",
    }
    wrong = []
    for name, targets in graph().items():
        for target in targets:
            if not name.startswith(FRONT_ENDS) and target.startswith(FRONT_ENDS):
                wrong.append(f"{name} -> {target}")
            if name.startswith(lower) and not (
                target.startswith(lower) or target in base or target == "mnist2db.datum_pb2"
            ):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def _homes(found: dict[str, int]) -> list[str]:
    return sorted(name for name, n in found.items() if n)


def test_a_fresh_seed_has_one_home() -> None:
    """Every drawn seed comes from :func:`mnist2db.selection.fresh_seed`."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    drawn = {module_name(p): text.count("os.urandom(8)") for p, text in sources.items()}
    assert _homes(drawn) == ["mnist2db.selection"]


def test_caffe_keys_are_formatted_in_one_home() -> None:
    """Caffe's key format ``b"%08d"`` is written once, :data:`mnist2db.formats.datum.message.KEY_FORMAT`
    (``record_key``, ``record_keys`` and the dataset's inlined hot path use it); the one
    literal ``%08d`` formatting left is ``image_list``'s ``%08d_PATH``, convert_imageset's
    key, a key of its own."""
    trees = modules()
    literal = {
        name: sum(
            1
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in (b"%08d", "%08d")
        )
        for name, tree in trees.items()
    }
    formatted = {
        name: sum(
            1
            for node in ast.walk(tree)
            if isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mod)
            and isinstance(node.left, ast.Constant)
            and "%08d" in str(node.left.value)
        )
        for name, tree in trees.items()
    }
    assert _homes(literal) == ["mnist2db.formats.datum.message"]
    assert _homes(formatted) == ["mnist2db.formats.lists.image_list"]


def _backend_compares(tree: ast.Module) -> int:
    names = {"lmdb", "leveldb"}
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Constant) and side.value in names
            for side in [node.left, *node.comparators]
        )
    )


#: Modules that still choose by a backend's name, each with its reason.
BACKEND_COMPARES_LEFT = {
    "mnist2db.imageset.to_database": "LMDB's mapped data.mdb: its written pages released",
}


def test_a_backend_is_chosen_by_name_in_one_home() -> None:
    """What differs between LMDB and LevelDB is written in ``storage/databases/backends.py``
    (:class:`~mnist2db.storage.databases.backends.Backend`) and the read handles, not decided by
    ``backend == "lmdb"`` wherever it matters."""
    found = {
        name
        for name, tree in modules().items()
        if _backend_compares(tree) and not name.startswith("mnist2db.storage.")
    }
    assert found <= set(BACKEND_COMPARES_LEFT)


def test_each_backend_chooses_its_read_handle() -> None:
    """The backend's entry in ``BACKEND`` names its read handle (no second table): each
    name is a handle class of that backend in ``storage/backend_handles``."""
    from mnist2db.storage.databases import handles as backend_handles
    from mnist2db.storage.databases.backends import BACKEND

    for name, backend in BACKEND.items():
        handles = backend_handles.handle_class(name)
        assert issubclass(handles, backend_handles.ReadHandle)
        assert (handles.__name__, handles.backend) == (backend.read_handle, name)
    tables = [
        f"{name}.{target.id}"
        for name, tree in modules().items()
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
        and "HANDLE" in target.id
        and name != "mnist2db.storage.databases.readers"
    ]
    assert tables == []


#: Private attributes reached on something other than ``self``/``cls``, each with its reason.
PRIVATE_REACHES = {
    "_replace": "a namedtuple's public method",
    "_make": "a namedtuple's public method",
    "sys._getframe": "the drop-ins name the calling tool as Caffe does",
    "Image._getdecoder": "Pillow's decoder, to read a header's size before any decode",
    "signal._HANDLER": "the standard library's type of a signal handler",
    "os._exit": "a forked worker ends without the parent's clean-up (atexit, its buffers)",
    "atexit._run_exitfuncs": "a script runs its exit handlers, then skips the teardown",
}


def test_no_object_reaches_into_another() -> None:
    """No module reaches a private attribute of an object it holds (the dataset read the
    LMDB handle's ``_local.txn`` once: the handle's ``lookup`` is its method now), and a
    backend's transactions (``.txn``) are touched only by the handle that owns them."""
    found = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if node.attr == "txn" and name != "mnist2db.storage.databases.handles":
                found.append(f"{name}: {ast.unparse(node)}")
            if not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if node.attr in PRIVATE_REACHES or any(text.endswith(k) for k in PRIVATE_REACHES):
                continue
            found.append(f"{name}: {text}")
    assert found == []


def test_no_class_is_made_by_a_metaclass() -> None:
    """The fast path's tuples are ``collections.namedtuple`` made by one plain function
    (``fastpath.named_tuple``), not a metaclass re-implementing ``typing.NamedTuple``."""
    found = [
        f"{name}.{node.name}"
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (
            any(k.arg == "metaclass" for k in node.keywords)
            or any(isinstance(b, ast.Name) and b.id == "type" for b in node.bases)
        )
    ]
    assert found == []


#: Modules of 500 lines or more, each with the second owner it is to be split by.
LONG_MODULES_LEFT: dict[str, str] = {}
#: Modules other work (own images, labels, export) is rewriting now: the checks below that
#: its changes could trip (a length, a lazy import) see them once that work has landed.
AT_WORK: tuple[str, ...] = ()


def at_work(name: str) -> bool:
    return any(
        name.startswith(prefix) if prefix.endswith(".") else name == prefix for prefix in AT_WORK
    )


def test_no_module_reaches_500_lines() -> None:
    """A module that grows past ~450 lines has a second owner: it is split by owner
    (reading/datum_dataset.py's record decoding, db_staging.py's journal, metadata.py's digest), not
    trimmed to stay under a count."""
    long = {
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if not p.name.endswith("_pb2.py") and len(p.read_text().splitlines()) >= 500
    }
    assert {name for name in long if not at_work(name)} <= set(LONG_MODULES_LEFT)


#: Format facts, each declared in one module (a module-level constant of that value
#: elsewhere is a second home), with the ones still left and why.
ONE_HOME_CONSTANTS = {
    b"\x89PNG\r\n\x1a\n": "mnist2db.formats.png.encoder",
    b"\x00\x00\x00\x00IEND\xaeB`\x82": "mnist2db.formats.png.encoder",
    1032: "mnist2db.formats.png.deflate",
    511: "mnist2db.storage.databases.backends",
    10**8: "mnist2db.formats.datum.message",
    (1 << 31) - 1: "mnist2db.formats.datum.message",
}
CONSTANTS_LEFT = {
    ("mnist2db.formats.imdecode.image_file", (1 << 31) - 1): "a record's largest size: protobuf's",
}


def test_format_constants_have_one_home() -> None:
    found = set()
    for name, tree in modules().items():
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            if not all(
                isinstance(n, ast.Constant | ast.BinOp | ast.UnaryOp | ast.operator | ast.unaryop)
                for n in ast.walk(node.value)
            ):
                continue  # literals and their arithmetic only
            value = eval(ast.unparse(node.value), {"__builtins__": {}})
            if isinstance(value, int | bytes) and not isinstance(value, bool):
                home = ONE_HOME_CONSTANTS.get(value)
                if home is not None and name != home:
                    found.add((name, value))
    assert found <= set(CONSTANTS_LEFT)


#: Imports inside functions outside the fast path (fastpath.FAST_PATH, which imports what
#: costs start-up where it is needed): at most this many a module, each with its reason.
LAZY_IMPORTS = {
    "mnist2db.formats.imdecode.png_decoder": (
        3,
        "Pillow, for encoded records that are not PNG only",
    ),
    "mnist2db.formats.imdecode.image_file": (
        2,
        "Pillow, for a header the reader cannot size itself; "
        "untrusted's words for a path not a file",
    ),
    "mnist2db.formats.imread.cv2_wheel": (
        2,
        "cv2: never for a plain PNG list; numpy for its probe (the PNG path loads none)",
    ),
    "mnist2db.formats.imread.imencode": (1, "Pillow, for --encoded jpg only"),
    "mnist2db.formats.imread.reader": (2, "Pillow, only for an image OpenCV does not decode"),
    "mnist2db.formats.plain_png": (
        2,
        "Pillow's core and, for RGB, its Image module: by the worker that decodes",
    ),
    "mnist2db.caffe_tools.convert_imageset": (7, "--help and flag errors before numpy, Pillow"),
    "mnist2db.cli.imageset_commands": (3, "imageset --help without the pipeline loaded"),
    "mnist2db.cli.export_commands": (3, "each --to's modules only for its own export"),
    "mnist2db.imageset.staged_checks": (
        2,
        "each backend's library only for the staged run it reads",
    ),
    "mnist2db.imageset.workers.pool": (
        2,
        "numpy and Pillow loaded before the workers fork, shared",
    ),
    "mnist2db.imageset.to_database": (
        3,
        "the label database's modules for a run with targets; a staged run's checks on --resume",
    ),
    "mnist2db.imageset.own_images": (3, "numpy's label tables and the IDX pair only when asked"),
    "mnist2db.imageset.work": (3, "numpy, Pillow, OpenCV for what plain_png does not read"),
}


def test_imports_are_at_the_top_outside_the_fast_path() -> None:
    from mnist2db.fastpath import FAST_PATH

    found = {}
    for name, tree in modules().items():
        if name in FAST_PATH or at_work(name):
            continue
        skip = _type_checking_nodes(tree)
        inner = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skip
        }
        if len(inner) > LAZY_IMPORTS.get(name, (0, ""))[0]:
            found[name] = len(inner)
    assert found == {}


def test_the_batch_byte_bound_has_one_home() -> None:
    """One 64 MiB bound for every batch (``storage.backends.BATCH_BYTES_LIMIT``): no module
    declares a batch constant of its own with that value."""
    found = sorted(
        f"{name}.{target.id}"
        for name, tree in modules().items()
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
        and "BATCH" in target.id
        and ast.unparse(node.value) in ("64 << 20", "64 * 2 ** 20", "67108864")
    )
    assert set(found) <= {
        "mnist2db.storage.databases.backends.BATCH_BYTES_LIMIT",
        "mnist2db.imageset.to_database.BATCH_BYTES",
    }


#: Inline names two commands declare, each meaning something different there.
DIFFERENT_MEANINGS = {
    "out": "mean's OUT is a file; imageset's a database or an IDX prefix",
    "--to": "imageset: db or idx; export: idx, files or webdataset",
    "out_dir": "export writes into it; create puts its databases there",
    "--label-db": "convert: a flag, also write one; verify: the label database to check",
    "--labels": "show: an IDX SOURCE's label file; imageset: a table of values per image",
    "--resume": "imageset: adopt a killed run's staged database; export: its finished shards",
}


def test_a_shared_option_is_declared_once() -> None:
    """An option (or argument) that two commands declare inline is declared twice: it
    belongs in ``cli/options.py``, so that a fix reaches both (``--overwrite`` was declared
    six times once). The backend is lower-cased there too, not by the commands."""
    declared: dict[str, set[str]] = {}
    lowered = []
    for name, tree in modules().items():
        if not name.startswith("mnist2db.cli.") or name == "mnist2db.cli.options":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "click.option",
                "click.argument",
            ):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        declared.setdefault(arg.value, set()).add(name)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "backend.lower":
                lowered.append(name)
    twice = {option for option, where in declared.items() if len(where) > 1}
    assert twice <= set(DIFFERENT_MEANINGS)
    assert lowered == []


def test_imageset_choices_are_their_owners() -> None:
    """imageset's --help is answered without loading the pipeline, so its choice lists are
    written in cli/imageset_commands.py: they must equal their owner's (images/own_images)."""
    from mnist2db.cli.imageset_commands import imageset
    from mnist2db.imageset.own_images import ENCODED, OUTPUTS

    choices = {p.name: tuple(p.type.choices) for p in imageset.params if hasattr(p.type, "choices")}
    assert choices["encoded"] == ENCODED and choices["to"] == OUTPUTS
