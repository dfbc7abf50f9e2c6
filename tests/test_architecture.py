"""The layout holds: no import circles, every package is packaged, modules and functions stay small.

The import graph is read with ``ast`` (nothing is imported). An edge is an explicit import of a
project module; importing a package counts as importing its ``__init__``. Imports under
``if TYPE_CHECKING:`` never run and are left out. Function-local imports are checked too: adding
them to the graph must not close a circle, so a lazy import can never be hiding one.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"mixle_parallel": "mixle_parallel", "contracts": "mixle_parallel.contracts",
          "executors": "mixle_parallel.executors", "verification": "mixle_parallel.verification"}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_PUBLIC_PARAMETERS = 12
MIXLE_COMPATIBLE_SIGNATURES = {
    "executors/estimation/api.py:encoded_data": (
        "data", "estimator", "model", "encoder", "placement", "resources", "engine", "precision", "num_chunks",
        "sub_chunks", "backend", "num_workers", "client", "comm", "root", "root_only", "parallel_chunks",
        "chunk_workers", "batch_size", "shuffle", "seed"),
}
"""Public functions allowed more than MAX_PUBLIC_PARAMETERS: mixle 0.8.2's own signatures (docs/compat.md),
each of which builds its options object at once. The named parameters must be exactly mixle's."""


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__) for every module of the package."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, package in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join([package, *parts])] = (path, is_package)
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, is_package: bool, modules: dict) -> tuple[set[str], set[str]]:
    """(module-level targets, function-level targets) among the project's modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    base = name.split(".") if is_package else name.split(".")[:-1]
    top, local = set(), set()

    def visit(node: ast.AST, in_function: bool) -> None:
        if _is_type_checking(node):
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(base[: len(base) - node.level + 1] + ([module] if module else []))
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in modules and target != name:
                (local if in_function else top).add(target)
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return top, local - top


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    top: dict[str, set[str]] = {}
    with_local: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        module_level, function_level = _imports(name, path, is_package, modules)
        top[name] = module_level
        with_local[name] = module_level | function_level
    return top, with_local


def test_the_walker_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    top, _ = _graphs()
    assert len(top) > 50, "the walker found too few modules: is the layout as pyproject.toml maps it?"
    assert _cycles(top) == [], "module-level import circles"


def test_no_function_local_import_hides_a_circle() -> None:
    _, with_local = _graphs()
    assert _cycles(with_local) == [], "function-local imports that would close an import circle"


def test_every_package_folder_is_packaged() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert config["package-dir"] == {package: folder for folder, package in LAYERS.items()}
    on_disk = {name for name, (_, is_package) in _modules().items() if is_package}
    assert set(config["packages"]) == on_disk


def test_modules_and_functions_stay_small() -> None:
    big_modules, big_functions = [], []
    folders = [*LAYERS, "benchmarks", "examples", "scripts", "docs"]
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(ROOT)
            if text.count("\n") > MAX_MODULE_LINES:
                big_modules.append(f"{rel} ({text.count(chr(10))} lines)")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        big_functions.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    assert not big_modules, f"modules over {MAX_MODULE_LINES} lines: {big_modules}"
    assert not big_functions, f"functions over {MAX_FUNCTION_LINES} lines: {big_functions}"


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_public_functions_take_at_most_twelve_parameters() -> None:
    wide, seen = [], set()
    for folder in LAYERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                    continue
                names = _parameters(node)
                allowed = MIXLE_COMPATIBLE_SIGNATURES.get(f"{rel}:{node.name}")
                if allowed is not None:
                    seen.add(f"{rel}:{node.name}")
                    named = [n for n in names if n not in (node.args.kwarg.arg if node.args.kwarg else "",)]
                    assert tuple(named) == allowed, f"{rel}:{node.name} is no longer mixle's signature: {named}"
                elif len(names) > MAX_PUBLIC_PARAMETERS:
                    wide.append(f"{rel}:{node.lineno} {node.name} ({len(names)} parameters)")
    assert not wide, f"public functions over {MAX_PUBLIC_PARAMETERS} parameters (take an options object): {wide}"
    assert seen == set(MIXLE_COMPATIBLE_SIGNATURES), "an allowed signature no longer exists: update the list"


def test_the_allowed_wide_signatures_are_mixles() -> None:
    import inspect

    import pytest

    parallel = pytest.importorskip("mixle.utils.parallel", reason="mixle 0.8.2 is the [mixle] extra")
    for where, names in MIXLE_COMPATIBLE_SIGNATURES.items():
        theirs = tuple(inspect.signature(getattr(parallel, where.split(":")[1])).parameters)
        assert names == theirs, f"{where}: mixle 0.8.2's signature is {theirs}"


def test_helpers_are_imported_as_packages() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("*.py"))
                 if p.name != Path(__file__).name and re.search(r"sys\.path\.(insert|append)", p.read_text())]
    assert not offenders, f"tests that edit sys.path instead of importing helpers as packages: {offenders}"


def test_layering_check_passes() -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), str(ROOT)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "modules over" not in done.stdout, done.stdout


def _module_list_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture_modules", ROOT / "scripts" / "architecture_modules.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_architecture_doc_lists_every_module_of_the_tree() -> None:
    """docs/architecture.md's module lists are what scripts/architecture_modules.py writes from today's tree."""
    script = _module_list_script()
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert script.rendered(doc) == doc, "docs/architecture.md drifted: run python scripts/architecture_modules.py"
    for name, (path, is_package) in _modules().items():
        if not is_package and not path.is_symlink():
            assert f"- `{path.name}`: " in doc, f"{name} is missing from docs/architecture.md"


def test_the_module_list_check_sees_a_drift() -> None:
    """A module line dropped from (or added to) the doc is caught, and the output does not change between runs."""
    script = _module_list_script()
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    line = next(x for x in doc.splitlines() if x.startswith("- `plan.py`: "))
    assert script.rendered(doc.replace(line + "\n", "")) != doc.replace(line + "\n", "")
    forged = doc.replace(line, line + "\n- `ghost.py`: a module that is not in the tree")
    assert script.rendered(forged) == doc
    assert script.module_lists() == script.module_lists()
