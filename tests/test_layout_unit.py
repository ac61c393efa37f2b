"""The shape issue 9 asks for, held: one concept per module of a few hundred lines (none over 500)
in every package of the project (node, semantic, federation, topology, bench: each top-level
directory with an ``__init__.py``; tests/ is not held to it), no function over 80 lines where
node's request path and generator live, and node's model modules free of I/O imports (STYLE.md 1
and 2). Reads the source; imports nothing."""

from __future__ import annotations

import ast
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
MODEL_MODULES = ("core/models/", "core/a2a/", "core/errors.py", "core/clock.py", "core/envelope.py", "core/lazy.py",
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
    assert not offending, f"a model module does no I/O (STYLE.md 2): {offending}"
