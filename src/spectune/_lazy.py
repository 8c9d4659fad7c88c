"""Lazy package exports (PEP 562): a package's public names load on first use.

``import spectune`` and the command line's parsers must not load torch, numba or
transformers: ``spectune --help`` would wait seconds for libraries it never calls. A
package lists its public names with the module each lives in; the module is imported
the first time one of its names is read, and the name is then kept in the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """The ``__getattr__`` for ``package``, given ``{module: names}`` of its public names."""
    home = {name: module for module, names in exports.items() for name in names}
    shadowed = frozenset(name for name, module in home.items() if module == f"{package}.{name}")
    if shadowed:
        sys.modules[package].__class__ = type("_Package", (_KeepsExports,), {"shadowed": shadowed})

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    return __getattr__


class _KeepsExports(ModuleType):
    """A package exporting a name that is also one of its submodules' (``health``, the
    function in ``spectune.monitor.health``): importing the submodule sets the package's
    attribute to the module, which would hide the function; the export is kept instead."""

    shadowed: frozenset[str] = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.shadowed and isinstance(value, ModuleType):
            return  # the submodule stays reachable as sys.modules[f"{package}.{name}"]
        super().__setattr__(name, value)
