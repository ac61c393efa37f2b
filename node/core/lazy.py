"""A package's names loaded when first used (PEP 562, as aiohttp's ``__init__`` does).

``node`` itself uses it, so that ``import node.client`` does not load the server with it while
``from node import RegistryNode`` still works.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, namespace: dict[str, Any], modules: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``modules`` (module, relative
    to the package -> the names it defines) is imported from its module on first use and kept in
    ``namespace`` (the package's globals), so later lookups skip ``__getattr__``."""
    module_of = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *module_of])

    return __getattr__, __dir__
