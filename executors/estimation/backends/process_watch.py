"""The processes this process has started, so ``encoded_data`` sees a backend factory that starts workers.

The admission gate decides on the world a backend *declares* before its factory runs; a third-party
factory that starts worker processes without declaring them would otherwise run as one local process
with no certificate. ``started_by(fn)`` runs ``fn`` and returns its result with the child processes
that appeared meanwhile (psutil where installed, else ``/proc``, else ``multiprocessing``'s children).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["child_processes", "started_by"]


def _psutil_children() -> frozenset[int] | None:
    """Every descendant of this process through psutil, or None without it."""
    try:
        import psutil  # type: ignore[import-untyped]  # optional; no stubs in the venv
    except ImportError:
        return None
    try:
        return frozenset(p.pid for p in psutil.Process().children(recursive=True))
    except psutil.Error:
        return None


def _proc_children(pid: int) -> frozenset[int] | None:
    """Every descendant of ``pid`` from ``/proc/<pid>/task/*/children`` (Linux), or None where there is none."""
    if not any(Path(f"/proc/{pid}/task").glob("*/children")):
        return None
    found: set[int] = set()
    todo = [pid]
    while todo:
        for listing in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = {int(p) for p in listing.read_text().split()}
            except (OSError, ValueError):  # the task or process ended meanwhile
                continue
            todo += sorted(kids - found)
            found |= kids
    return frozenset(found)


def child_processes() -> frozenset[int]:
    """The pids of every live (or not yet reaped) descendant of this process."""
    for found in (_psutil_children(), _proc_children(os.getpid())):
        if found is not None:
            return found
    return frozenset(p.pid for p in multiprocessing.active_children() if p.pid is not None)


def started_by(fn: Callable[[], Any]) -> tuple[Any, frozenset[int]]:
    """``(fn(), pids)``: the result of ``fn`` and the child processes started while it ran."""
    before = child_processes()
    result = fn()
    return result, child_processes() - before
