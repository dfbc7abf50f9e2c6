"""The ``if __name__ == "__main__":`` guard an engine needs when its workers re-import the user's script.

Python's ``spawn`` start (``mp``'s default) runs the main script again in every worker so that what it
defines can be unpickled there. A script that starts workers at its top level, outside the guard,
would start them again in each worker: :func:`require_main_guard` refuses that before any worker
starts, with one line naming the guard.
"""

from __future__ import annotations

import ast
import sys
from types import FrameType, ModuleType

__all__ = ["require_main_guard", "unguarded_main_line"]


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


def require_main_guard(backend: str) -> None:
    """Refuse to start ``backend``'s workers from an unguarded top level of the main script."""
    line = unguarded_main_line()
    if line is not None:
        path = getattr(sys.modules.get("__main__"), "__file__", "the script")
        raise RuntimeError(f"backend {backend!r} starts worker processes, which re-import {path}: put the code that "
                           f"starts them (line {line}) under `if __name__ == \"__main__\":`")
