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
            # "from mnist2db.formats import idx" imports the module mnist2db.formats.idx
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
    """Every drawn seed comes from :func:`mnist2db.records.fresh_seed`."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    drawn = {module_name(p): text.count("os.urandom(8)") for p, text in sources.items()}
    assert _homes(drawn) == ["mnist2db.records"]


def test_caffe_keys_are_formatted_in_one_home() -> None:
    """Caffe's key format ``b"%08d"`` is written once, :data:`mnist2db.formats.datum.KEY_FORMAT`
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
    assert _homes(literal) == ["mnist2db.formats.datum"]
    assert _homes(formatted) == ["mnist2db.formats.image_list"]


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
    "mnist2db.images.datum_records": "LMDB's mapped data.mdb: its written pages released",
}


def test_a_backend_is_chosen_by_name_in_one_home() -> None:
    """What differs between LMDB and LevelDB is written in ``storage/backends.py``
    (:class:`~mnist2db.storage.backends.Backend`) and the read handles, not decided by
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
    from mnist2db.storage import backend_handles
    from mnist2db.storage.backends import BACKEND

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
        and name != "mnist2db.storage.readers"
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
            if node.attr == "txn" and name != "mnist2db.storage.backend_handles":
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
    (dataset.py's record decoding, db_staging.py's journal, metadata.py's digest), not
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
    b"\x89PNG\r\n\x1a\n": "mnist2db.formats.png",
    b"\x00\x00\x00\x00IEND\xaeB`\x82": "mnist2db.formats.png",
    1032: "mnist2db.formats.deflate",
    511: "mnist2db.storage.backends",
    10**8: "mnist2db.formats.datum",
    (1 << 31) - 1: "mnist2db.formats.datum",
}
CONSTANTS_LEFT = {
    ("mnist2db.formats.image_input", (1 << 31) - 1): "a record's largest size: protobuf's",
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
    "mnist2db.dataset": (1, "labels.dataset imports dataset: at the top, a circle"),
    "mnist2db.formats.png_codec": (3, "Pillow, for encoded records that are not PNG only"),
    "mnist2db.formats.image_input": (
        2,
        "Pillow, for a header the reader cannot size itself; "
        "fetch.untrusted's words for a path not a file",
    ),
    "mnist2db.formats.opencv": (
        2,
        "cv2: never for a plain PNG list; numpy for its probe (the PNG path loads none)",
    ),
    "mnist2db.formats.image_encode": (1, "Pillow, for --encoded jpg only"),
    "mnist2db.formats.image": (2, "Pillow, only for an image OpenCV does not decode"),
    "mnist2db.formats.plain_png": (
        2,
        "Pillow's core and, for RGB, its Image module: by the worker that decodes",
    ),
    "mnist2db.caffe_tools.convert_imageset": (7, "--help and flag errors before numpy, Pillow"),
    "mnist2db.cli.imageset_commands": (3, "imageset --help without the pipeline loaded"),
    "mnist2db.cli.export_commands": (3, "each --to's modules only for its own export"),
    "mnist2db.images.resume": (2, "each backend's library only for the staged run it reads"),
    "mnist2db.images.workers": (2, "numpy and Pillow loaded before the workers fork, shared"),
    "mnist2db.images.datum_records": (2, "the label database's modules for a run with targets"),
    "mnist2db.images.own_images": (3, "numpy's label tables and the IDX pair only when asked"),
    "mnist2db.images.record_work": (3, "numpy, Pillow, OpenCV for what plain_png does not read"),
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
        "mnist2db.storage.backends.BATCH_BYTES_LIMIT",
        "mnist2db.images.datum_records.BATCH_BYTES",
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
    from mnist2db.images.own_images import ENCODED, TARGETS

    choices = {p.name: tuple(p.type.choices) for p in imageset.params if hasattr(p.type, "choices")}
    assert choices["encoded"] == ENCODED and choices["to"] == TARGETS
