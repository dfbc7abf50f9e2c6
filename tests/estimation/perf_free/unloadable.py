"""Encoded data a fresh worker process cannot load (module-level so the driver can pickle it)."""

from __future__ import annotations

import multiprocessing
from typing import Any


def _load_here() -> str:
    if multiprocessing.parent_process() is not None:
        raise ImportError("No module named 'site_only_codec' (installed on the driver only)")
    return "loaded"


class OnlyOnTheDriver:
    """Unpickles on the driver, raises ImportError in any child process."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _load_here, ()
