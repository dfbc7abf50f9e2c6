"""The user's main module and worker processes: keep it out of ours, or require its guard where an engine re-runs it.

Python's ``spawn`` start runs the main script again in every worker so that what it defines can be
unpickled there; a script that starts workers at its top level, outside ``if __name__ == "__main__":``,
would start them again in each worker. Workers we start ourselves (``mp``) never run it:
:func:`main_left_out` starts them with no main module to re-run, and :func:`dumps_for_workers` ships what
the script defines by value (cloudpickle), as joblib's loky does. Where an engine's own start re-runs it
(a local Dask cluster), :func:`require_main_guard` refuses an unguarded top level before any worker starts,
with one line naming the guard.
"""

from __future__ import annotations

import ast
import contextlib
import pickle
import sys
import threading
from collections.abc import Iterator
from types import FrameType, ModuleType
from typing import Any

__all__ = ["dumps_for_workers", "main_left_out", "require_main_guard", "unguarded_main_line"]

_MAIN_LOCK = threading.Lock()
_MAIN_NAME = b"__main__"


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, *test.comparators]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


def _module_frame(main: ModuleType) -> FrameType | None:
    """The frame running the main script's top level, if this call comes from it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def unguarded_main_line() -> int | None:
    """The line of the main script whose top-level statement (outside ``if __name__ == "__main__":``) led to
    this call, or None: guarded, called from elsewhere, or no script file (an interactive session, ``-c``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None  # ``python -m package``: spawn does not run a package's __main__ again
    frame = _module_frame(main)
    if frame is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    line = frame.f_lineno
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= (node.end_lineno or 0):
            return None
    return line


def require_main_guard(backend: str, *, processes: Any = True) -> None:
    """Refuse to start ``backend``'s worker processes from an unguarded top level of the main script
    (nothing to refuse when ``processes`` is false: threads re-run nothing)."""
    line = unguarded_main_line() if processes else None
    if line is not None:
        path = getattr(sys.modules.get("__main__"), "__file__", "the script")
        raise RuntimeError(f"backend {backend!r} starts worker processes, which re-import {path}: put the code that "
                           f"starts them (line {line}) under `if __name__ == \"__main__\":`")


@contextlib.contextmanager
def main_left_out() -> Iterator[None]:
    """Within this block, processes started with ``spawn`` or ``forkserver`` do not run the main module.

    ``multiprocessing`` tells a new process to re-run the script named by ``sys.modules["__main__"]``
    (its ``__file__``, or its ``__spec__`` for ``python -m``); for the block's length that entry is an
    empty module, so there is nothing to re-run, guarded or not. What the script defines reaches the
    workers by value instead (:func:`dumps_for_workers`).
    """
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = ModuleType("__main__")
        try:
            yield
        finally:
            if main is None:
                sys.modules.pop("__main__", None)
            else:
                sys.modules["__main__"] = main


def dumps_for_workers(value: Any) -> bytes:
    """Pickle ``value`` for a worker that never ran the main module: by reference (plain pickle, the fast
    path), unless it names something of ``__main__``, which then goes by value with cloudpickle."""
    try:
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        blob = _MAIN_NAME  # e.g. a lambda or a class a worker defined by value: cloudpickle may manage it
    if _MAIN_NAME not in blob:
        return blob
    try:
        import cloudpickle
    except ImportError:
        raise RuntimeError(
            "the fit ships functions or classes defined in the main script to worker processes, which never "
            "run that script: install cloudpickle (`pip install cloudpickle`) or define them in an importable module"
        ) from None
    return bytes(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
