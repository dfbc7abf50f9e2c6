"""What mixle's submodule-named facade modules share: names that load their (heavy) module on first use."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving each of ``names`` (name -> defining module) when first accessed."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(import_module(names[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
