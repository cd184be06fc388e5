"""Packages whose public names are imported when first used (``jaxnet``, ``jaxnet.data``), so that
a program that needs a light part of them (the command's --help, ``jaxnet prepare``) never pays for
JAX.

:func:`lazy_package` gives a package a module ``__getattr__`` (PEP 562) over a table
``{name: (module, attribute or None for the module itself)}`` and keeps a public function's name
when the import system binds a submodule of the same name (``jaxnet.train``, ``jaxnet.data.arrays``)
as the package's attribute, as it was when the package imported everything at once.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any


class _Package(types.ModuleType):
    """A lazy package (see the module docstring)."""

    _lazy: Mapping[str, tuple[str, str | None]] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        module, attr = self._lazy.get(name, (None, None))
        if isinstance(value, types.ModuleType) and value.__name__ == module and attr is not None:
            value = getattr(value, attr)
        super().__setattr__(name, value)


def lazy_package(name: str, table: Mapping[str, tuple[str, str | None]], submodules: bool = False) -> None:
    """Make the package ``name`` import the names of ``table`` on first use; with ``submodules``,
    any other name is tried as one of its modules (``jaxnet.data.text`` after ``import
    jaxnet.data``)."""
    package = sys.modules[name]

    def __getattr__(attribute: str) -> Any:
        if attribute in table:
            module, attr = table[attribute]
            value = importlib.import_module(module)
            value = value if attr is None else getattr(value, attr)
        elif submodules and not attribute.startswith("__"):
            try:
                value = importlib.import_module(f"{name}.{attribute}")
            except ModuleNotFoundError as e:
                if e.name != f"{name}.{attribute}":
                    raise
                raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None
        else:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        package.__dict__[attribute] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*package.__dict__, *table})

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    package.__dir__ = __dir__  # type: ignore[method-assign]
    package.__class__ = type("_Package", (_Package,), {"_lazy": dict(table)})
