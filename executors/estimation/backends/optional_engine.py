"""Import an optional engine package, or say which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from ....contracts.errors import MissingExtraError

__all__ = ['require_engine']


def require_engine(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module.split(".")[0], extra) from exc
