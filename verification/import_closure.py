"""The modules a third party's code reaches: the import closure a certificate's code digest binds.

A third-party backend's factory module may import a sibling module, a helper package or read a data file
beside them; all of that runs, so all of it is bound (issue 34 item 4). ``closure_files(module_name)`` starts
at the defining module, takes the code that holds it (``source_binding.package_files``: its top-level
regular package's whole tree, data files included, or the lone module file) and follows, from every Python
file in that set, the modules it imports (``import x``, ``from x import y``, relative imports) and the
modules its live globals come from (``helper = importlib.import_module("x")``), until nothing new is found.

It stops at the standard library, at installed distributions (anything under site-packages, or a top-level
name ``importlib.metadata`` maps to a distribution) and at this library (built-ins bind it as a whole).
An import that cannot be resolved (an optional dependency that is absent) binds nothing: it cannot run.

Reading and hashing stay with ``source_binding`` (every call reads the bytes); only the parse of a file's
imports is cached, keyed by the sha256 of its bytes, so an edit that adds an import is always seen.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.metadata
import site
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

__all__ = ["closure_files", "holding_files", "is_outside_closure"]

_IMPORTS_BY_DIGEST: dict[str, frozenset[str]] = {}
"""sha256 of a file's bytes -> the absolute module names it imports (parsing is the only costly step)."""


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[Path, ...]:
    """Folders whose code belongs to the interpreter or an installed distribution."""
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", lambda: None)())
    return tuple(Path(r).resolve() for r in roots if r)


@functools.lru_cache(maxsize=1)
def _distribution_top_levels() -> frozenset[str]:
    """Top-level import names that installed distributions provide (editable installs included)."""
    return frozenset(importlib.metadata.packages_distributions())


def _under_installed_root(path: Path) -> bool:
    return any(path.is_relative_to(root) for root in _installed_roots())


def is_outside_closure(module_name: str, is_builtin: Callable[[str], bool]) -> bool:
    """True when ``module_name`` is not third-party code to bind: this library (``is_builtin``), the standard
    library, or an installed distribution."""
    top = module_name.split(".", 1)[0]
    if is_builtin(module_name) or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    if top in _distribution_top_levels():
        return True
    origin = _origin(module_name)
    return origin is None or _under_installed_root(origin)


def _origin(module_name: str) -> Path | None:
    """The file (or namespace folder) a module is loaded from, found without running any of it.

    An imported module answers from ``sys.modules``; otherwise each part of the dotted name is looked up
    with ``PathFinder`` on its parent's search path, which reads folders but imports nothing."""
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        return Path(where).resolve() if where else None
    parts = module_name.split(".")
    search: list[str] | None = None
    spec = None
    for end in range(1, len(parts) + 1):
        qualified = ".".join(parts[:end])
        parent = sys.modules.get(qualified)
        try:
            spec = (getattr(parent, "__spec__", None) if parent is not None
                    else importlib.machinery.PathFinder.find_spec(qualified, search))
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
        if search is None and end < len(parts):
            return None
    if spec is None:
        return None
    if spec.has_location and spec.origin:
        return Path(spec.origin).resolve()
    return Path(search[0]).resolve() if search else None


def holding_files(origin: Path, tree: Callable[[Path], set[Path]]) -> set[Path]:
    """The code that holds a module loaded from ``origin``: the tree of its outermost regular package (every
    file, data included), or the lone module file; a namespace folder holds nothing of its own."""
    folder = origin if origin.is_dir() else origin.parent
    if not (folder / "__init__.py").is_file():
        return set() if origin.is_dir() else {origin}
    while (folder.parent / "__init__.py").is_file():
        folder = folder.parent
    return tree(folder)


def _package_of(path: Path) -> str:
    """The dotted package a file belongs to, from the ``__init__.py`` files above it ('' for a top-level module)."""
    parts: list[str] = []
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def _imports_of(path: Path, data: bytes) -> frozenset[str]:
    """The absolute names ``path`` imports (a file that does not parse imports nothing it could run)."""
    key = hashlib.sha256(data).hexdigest()
    found = _IMPORTS_BY_DIGEST.get(key)
    if found is not None:
        return found
    names: set[str] = set()
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError):
        tree = ast.Module(body=[], type_ignores=[])
    package = _package_of(path)  # a module's package, or (``__init__.py``) the package itself: relative imports' anchor
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, *([base] if base else [])])
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    found = frozenset(names)
    _IMPORTS_BY_DIGEST[key] = found
    return found


def _live_references(module: ModuleType) -> set[str]:
    """Modules the globals of an imported module come from (what a dynamic import left behind)."""
    names: set[str] = set()
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            names.add(value.__name__)
        else:
            owner = getattr(value, "__module__", None)
            if isinstance(owner, str):
                names.add(owner)
    return names


def closure_files(start: set[Path], module_name: str, tree: Callable[[Path], set[Path]],
                  is_builtin: Callable[[str], bool]) -> set[Path]:
    """Every file of the third-party code reached from ``module_name``, whose own code is ``start``.

    ``tree(folder)`` lists a package folder's files; ``is_builtin`` says which names belong to this library.
    Standard library and installed distributions are left out; nothing is imported to find a module.
    """
    files = set(start)
    done = {module_name}
    pending = sorted(_reached_from(start) | _live(module_name))
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        if is_outside_closure(name, is_builtin):
            continue
        origin = _origin(name)
        held = holding_files(origin, tree) if origin is not None else set()
        fresh = held - files
        files |= held
        pending.extend((_reached_from(fresh) | _live(name)) - done)
    return files


def _live(module_name: str) -> set[str]:
    module = sys.modules.get(module_name)
    return _live_references(module) if module is not None else set()


def _reached_from(paths: Iterable[Path]) -> set[str]:
    """The modules the Python files among ``paths`` import."""
    names: set[str] = set()
    for path in paths:
        if path.suffix == ".py":
            names |= _imports_of(path, path.read_bytes())
    return names
