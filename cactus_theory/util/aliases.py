"""Public module paths that name a module living elsewhere in the package.

``install(table)`` adds an import hook: importing an alias (a key of ``table``, e.g.
``cactus_theory.sampler``) imports its target (``cactus_theory.core.sampler``) and binds the same module
object under both names, so attributes, private names and monkeypatching agree under either path. The
target loads only when the alias is first imported. No project imports.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping

__all__ = ["install"]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module) -> None:
        # the import system returns whatever sys.modules holds under the alias once this returns
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, table: Mapping[str, str]):
        self.table = dict(table)

    def find_spec(self, fullname, path=None, target=None):
        dest = self.table.get(fullname)
        if dest is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(dest))


def install(table: Mapping[str, str]) -> None:
    """Serve each ``alias -> target`` of ``table`` (full dotted names); once per table owner."""
    for f in sys.meta_path:
        if isinstance(f, _AliasFinder) and f.table == dict(table):
            return
    sys.meta_path.insert(0, _AliasFinder(table))
