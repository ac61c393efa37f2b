"""The layout CONTRIBUTING.md describes ("Where code goes"), held: one concept per module of a few
hundred lines (none over 500) in every package of the project (node, semantic, federation,
topology, bench: each top-level directory with an ``__init__.py``; tests/ is not held to it), no
function over 80 lines where node's request path and generator live, node's model modules free of
I/O imports, and node's rooms: few modules each, a face in ``__all__``, imports one way and through
faces only, the SDK on core and delivery alone. Reads the source (and imports a face to read its
``__all__``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node"
# Test modules group a feature's scenarios and are read one test at a time: not held to the limit.
NOT_HELD = frozenset({"tests"})
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# Where a long function is hardest to read: the request path, the SDK, the document generator.
SHORT_FUNCTIONS = ("http/api.py", "routing/router.py", "http/watch_stream.py", "client/", "delivery/", "http/openapi/")
MODEL_MODULES = ("core/models/", "core/a2a/", "core/errors.py", "core/clock.py", "core/envelope.py",
                 "store/scripts.py")
IO_MODULES = frozenset({"aiohttp", "redis", "aiokafka", "asyncio", "socket", "prometheus_client", "subprocess"})


def _modules() -> list[Path]:
    found = sorted(NODE.rglob("*.py"))
    assert len(found) > 40, found  # the walk found node/, not an empty directory
    return found


def _name(path: Path) -> str:
    return path.relative_to(NODE).as_posix()


def _selected(path: Path, prefixes: tuple[str, ...]) -> bool:
    return _name(path).startswith(prefixes)


def _packages() -> list[Path]:
    found = sorted(path.parent for path in ROOT.glob("*/__init__.py") if path.parent.name not in NOT_HELD)
    names = {path.name for path in found}
    assert {"node", "semantic", "federation", "topology", "bench"} <= names, names
    return found


def test_no_module_of_any_package_is_over_500_lines() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for package in _packages() for path in package.rglob("*.py")}
    assert len(sizes) > 100, sizes  # the walk found every package, not an empty directory
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_long, f"split these by concept: {too_long}"


def test_no_function_on_the_request_path_or_in_the_generator_is_over_80_lines() -> None:
    checked = [path for path in _modules() if _selected(path, SHORT_FUNCTIONS)]
    assert any(_name(path).startswith("http/openapi/") for path in checked)
    too_long = {}
    for path in checked:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    too_long[f"{_name(path)}:{node.name}"] = lines
    assert not too_long, f"split these functions: {too_long}"


def test_model_modules_import_no_io_module() -> None:
    checked = [path for path in _modules() if _selected(path, MODEL_MODULES)]
    assert len(checked) >= 10, [_name(path) for path in checked]
    offending = {}
    for path in checked:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            if roots & IO_MODULES:
                offending[_name(path)] = sorted(roots & IO_MODULES)
    assert not offending, f"a model module does no I/O (CONTRIBUTING.md, Where code goes): {offending}"


# -- rooms (issue 23): the folder is the map -------------------------------------------------------

ROOMS = ("core", "delivery", "client", "store", "view", "routing", "trust", "duties", "http", "ops")
ROOT_MODULES = frozenset({"node.service", "node.parts", "node.config", "node.envconfig"})
# What each room may import of the others: one way, bottom to top ("root" is service, parts and config).
MAY_IMPORT = {
    "core": set(),
    "delivery": {"core"},
    "client": {"core", "delivery"},
    "store": {"core"},
    "view": {"core", "store"},
    "trust": {"core", "store"},
    "routing": {"core", "delivery", "store", "view", "trust"},
    "duties": {"core", "store", "view", "trust"},
    "ops": {"core"},
    "root": {"core", "delivery", "store", "view", "trust", "routing", "duties", "ops"},  # never http: it stands above
    "http": {"core", "delivery", "store", "view", "trust", "routing", "duties", "ops", "root"},
}
# Modules of a room that are public beside its face: loaded on their own because they are heavy.
PUBLIC_MODULES = frozenset({"node.client.host"})
MAX_ROOT_MODULES = 10
MAX_ROOM_MODULES = 15


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, names, line) of every ``from … import …`` of ``node`` in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for statement in ast.walk(ast.parse(path.read_text())):
        if not isinstance(statement, ast.ImportFrom):
            continue
        if statement.level:
            base = package.split(".")[: len(package.split(".")) - statement.level + 1]
            target = ".".join([*base, statement.module] if statement.module else base)
        else:
            target = statement.module or ""
        if target == "node" or target.startswith("node."):
            found.append((target, [alias.name for alias in statement.names], statement.lineno))
    return found


def _room(module: str) -> str:
    """The room a ``node`` module lives in: ``core`` for node.core.models.fields, ``root`` for
    node.service, ``node`` for the package itself."""
    if module in ROOT_MODULES:
        return "root"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "node"


def _face(module: str) -> str:
    """The package whose ``__init__`` a module's names are imported through from outside."""
    return module if _is_package(module) else module.rpartition(".")[0]


def test_node_is_rooms_of_a_few_modules_each() -> None:
    root_modules = sorted(path.name for path in NODE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules
    rooms = sorted(path.parent.relative_to(NODE).as_posix() for path in NODE.rglob("__init__.py") if path.parent != NODE)
    assert set(ROOMS) <= set(rooms), rooms
    crowded = {room: count for room in rooms if (count := len(list((NODE / room).glob("*.py")))) > MAX_ROOM_MODULES}
    assert not crowded, f"split these rooms by concept: {crowded}"
    for room in rooms:
        init = (NODE / room / "__init__.py").read_text()
        assert "__all__" in init, f"node/{room}/__init__.py names no public face (__all__)"


def _crossings() -> list[tuple[str, str, list[str], int]]:
    """(importer, imported module, names, line) of every import that crosses into another room of
    node, from node itself and from the packages beside it."""
    crossings = []
    for top in ("node", "federation", "topology", "semantic"):
        for path in sorted((ROOT / top).rglob("*.py")):
            importer = _module_name(path)
            for target, names, line in _imports(path):
                if top == "node" and _room(importer) == _room(target):
                    continue
                crossings.append((importer, target, names, line))
    assert len(crossings) > 100, len(crossings)  # the walk read the imports, not an empty tree
    return crossings


def test_rooms_depend_one_way() -> None:
    upward = set()
    for importer, target, _names, line in _crossings():
        if not importer.startswith("node.") or importer in ("node",):
            continue
        mine, theirs = _room(importer), _room(target)
        if theirs not in MAY_IMPORT.get(mine, set()) and theirs != "node":
            upward.add(f"{importer}:{line} imports {target} ({mine} -> {theirs})")
    assert not upward, sorted(upward)


def test_other_rooms_and_packages_import_only_a_rooms_face() -> None:
    private = set()
    for importer, target, names, line in _crossings():
        if target in ROOT_MODULES or target in PUBLIC_MODULES or target == "node":
            continue
        if importer.startswith("node.") and _room(importer) == "core" and _room(target) == "core":
            continue  # a sub-room of core reading its parent's modules
        face = _face(target)
        if face != target:
            private.add(f"{importer}:{line} imports {target}, inside the room {face}")
            continue
        exported = set(importlib.import_module(target).__all__)
        hidden = [name for name in names if name not in exported or name.startswith("_")]
        if hidden:
            private.add(f"{importer}:{line} imports {hidden} from {target}, which does not export them")
    assert not private, sorted(private)


def test_the_sdk_stands_on_core_and_delivery_only() -> None:
    client = [path for path in (NODE / "client").rglob("*.py")]
    assert len(client) > 5, client
    reached = {_room(target) for path in client for target, _names, _line in _imports(path)} - {"client"}
    assert reached <= {"core", "delivery"}, reached
    delivery = {_room(target) for path in (NODE / "delivery").rglob("*.py") for target, _n, _l in _imports(path)}
    assert delivery - {"delivery"} <= {"core"}, delivery
