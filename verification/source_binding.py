"""Which files a certificate's code digest covers, and their digest, read from disk on every call.

A certificate is a claim about code, so its digest covers every module the executor runs:

* a built-in executor (defined in this library) runs its own package *and* the shared code around it
  (the contracts it computes with, the gate, audits and ledger it calls inside a step, the registry),
  so built-ins bind every file of the installed library (``contracts``, ``verification``,
  ``executors`` and the facade), code and package data alike;
* any other executor binds the code of the package that defines its class (``package_files``): the
  tree of its top-level regular package, every file in it (package data included, not only ``*.py``),
  or the module file itself when it is a top-level module (a script's ``__main__`` included), and the
  same for every module that code imports outside the standard library and installed distributions
  (``bound_files``, ``import_closure``): a sibling module edited after certification needs a new one;
* an executor may add files with ``source_files()`` (a third-party EM backend adds the package of its
  registered factory, ``executors.estimation.executor_identity``).

Nothing is cached: every file is read and hashed on every call (a few milliseconds for the library),
so an edit that keeps a file's size and modification time is seen within one process as well.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .import_closure import closure_files

__all__ = [
    "bound_files", "builtin_files", "code_files", "defining_module", "file_digests", "files_digest",
    "is_builtin_module", "object_files", "package_files",
]

_ROOT = __name__.split(".", 1)[0]
"""The library's top-level package (``mixle_parallel``)."""

_LAYERS = ("contracts", "verification", "executors")
_SKIPPED_DIRS = frozenset({"__pycache__"})
_SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})


def _tree(folder: Path) -> set[Path]:
    """Every regular file below ``folder`` except byte-code caches (which Python rewrites on its own)."""
    found: set[Path] = set()
    for where, dirs, names in os.walk(folder.resolve()):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        found.update(Path(where, n) for n in names if os.path.splitext(n)[1] not in _SKIPPED_SUFFIXES
                     and os.path.isfile(os.path.join(where, n)))
    return found


def is_builtin_module(name: str) -> bool:
    """True for a module of this library (``mixle_parallel`` or below)."""
    return name == _ROOT or name.startswith(_ROOT + ".")


def builtin_files() -> set[Path]:
    """Every file of the installed library: the facade and its ``contracts``, ``verification``, ``executors``."""
    files: set[Path] = set()
    for name in (_ROOT, *(f"{_ROOT}.{layer}" for layer in _LAYERS)):
        spec = importlib.util.find_spec(name)  # locates the package without running it
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            files |= _tree(Path(folder))
    return files


def _top_regular_package(name: str) -> Any:
    """The outermost package of ``name`` that is a regular package (has a file); None for a top-level module."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end])) or importlib.import_module(".".join(parts[:end]))
        if hasattr(module, "__path__") and getattr(module, "__file__", None):
            return module
        if not hasattr(module, "__path__"):
            return None
    return None


def package_files(module_name: str) -> set[Path]:
    """The files of the code that defines ``module_name``: the library, its top-level regular package's tree,
    or (a top-level module) the module file; ``ValueError`` when it has no file to bind."""
    if is_builtin_module(module_name):
        return builtin_files()
    package = _top_regular_package(module_name)
    if package is not None:
        return set().union(*(_tree(Path(folder)) for folder in package.__path__))
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        raise ValueError(f"module {module_name!r} has no source file (defined interactively?), so a certificate "
                         "cannot bind its code; define the executor or backend in a module file")
    return {Path(origin).resolve()}


def defining_module(thing: Any) -> str:
    """The module that defines a function, class, ``functools.partial`` or callable object."""
    while hasattr(thing, "func") and callable(thing.func) and not hasattr(thing, "__code__"):
        thing = thing.func  # functools.partial and friends: the wrapped callable is the code that runs
    name = getattr(thing, "__module__", None)
    return name if isinstance(name, str) else type(thing).__module__


def bound_files(module_name: str) -> set[Path]:
    """``package_files`` of ``module_name`` and, for third-party code, of everything it imports outside the
    standard library and installed distributions (``import_closure``): sibling modules, helper packages, data."""
    files = package_files(module_name)
    if is_builtin_module(module_name):
        return files
    return closure_files(files, module_name, _tree, is_builtin_module)


def object_files(thing: Any) -> set[Path]:
    """``bound_files`` of the module defining ``thing`` (a factory, a runner class, an executor)."""
    return bound_files(defining_module(thing))


def code_files(executor: Any) -> list[Path]:
    """The files ``executor``'s certificate binds: those its class's module reaches plus its ``source_files()``."""
    files = bound_files(type(executor).__module__)
    declared = getattr(executor, "source_files", None)
    if callable(declared):
        files |= {Path(p).resolve() for p in declared()}
    return sorted(files)


def file_digests(files: Iterable[Path]) -> dict[str, str]:
    """The sha256 (hex) of each file's bytes, by path relative to the files' common folder."""
    ordered = sorted(files)
    root = os.path.commonpath([str(f.parent) for f in ordered]) if ordered else ""
    return {os.path.relpath(path, root): hashlib.sha256(path.read_bytes()).hexdigest() for path in ordered}


def files_digest(files: Iterable[Path]) -> str:
    """``sha256:<hex>`` over (path relative to the files' common folder, sha256 of the bytes) of each file."""
    ordered = sorted(files)
    root = os.path.commonpath([str(f.parent) for f in ordered]) if ordered else ""
    outer = hashlib.sha256()
    for path in ordered:
        outer.update(f"{os.path.relpath(path, root)}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return "sha256:" + outer.hexdigest()
