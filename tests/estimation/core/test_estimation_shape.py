"""The EM wing's seams hold (issue 33, DESIGN §9): read from the source with ``ast`` (the family test imports the
runner modules, which import no engine).

No class of the EM wing is over 300 lines (split at seams: the handle's mixle sequence methods, mini-batch
passes and verification binding, the mp runner's worker processes, the runner families' shared code live in
modules of their own); every built-in runner is an instance of its family's base (``backends.runner_families``);
no collaborator (runner, handle, audit, session, ledger) is probed by a
name with ``hasattr``/``getattr`` (a runtime-checkable Protocol of ``em_pass.runner_protocols`` is checked
instead); and no parameter or attribute named for a collaborator is typed ``Any``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ESTIMATION = ROOT / "executors" / "estimation"
COLLABORATORS = {"runner", "handle", "audit", "session", "ledger"}
MAX_CLASS_LINES = 300


def _trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8")) for p in ESTIMATION.rglob("*.py")}


def _names_collaborator(node: ast.expr) -> bool:
    """``runner`` / ``handle`` / ... or ``self.runner`` / ``self._audit`` / ..."""
    if isinstance(node, ast.Name):
        return node.id in COLLABORATORS
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr.lstrip("_") in COLLABORATORS)


def _class_lengths(tree: ast.AST) -> dict[str, int]:
    """Every class in ``tree`` (nested ones too) -> its lines, ``end_lineno - lineno + 1``."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None}


def test_no_em_class_is_over_300_lines() -> None:
    long = [f"{path}: {name} ({lines} lines)" for path, tree in _trees().items()
            for name, lines in _class_lengths(tree).items() if lines > MAX_CLASS_LINES]
    assert long == [], f"split these at their seams (no EM class over {MAX_CLASS_LINES} lines)"


def test_the_class_scan_sees_a_long_class() -> None:
    """The scan above sees every class of the wing (the handle among them) and would see a long one."""
    scanned = {name for tree in _trees().values() for name in _class_lengths(tree)}
    assert {"ChunkedEncodedData", "MPChunkRunner", "EMAudit", "RayRunner"} <= scanned
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_CLASS_LINES))
    nested = ast.parse(f"def f():\n    class Long:\n{body}")  # a class inside a function is scanned too
    assert _class_lengths(nested) == {"Long": MAX_CLASS_LINES + 1}


def test_no_collaborator_is_probed_by_name() -> None:
    probes = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and _names_collaborator(node.args[0])):
                probes.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    assert probes == [], "check a runtime-checkable Protocol (em_pass.runner_protocols) instead"


def test_no_collaborator_is_typed_any() -> None:
    untyped = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg in COLLABORATORS - {"ledger"}:
                annotation, where = node.annotation, node.arg
            elif isinstance(node, ast.AnnAssign) and _names_collaborator(node.target):
                annotation, where = node.annotation, ast.unparse(node.target)
            else:
                continue
            if isinstance(annotation, ast.Name) and annotation.id == "Any":
                untyped.append(f"{path}:{node.lineno} {where}: Any")
    assert untyped == [], "type it with a Protocol of em_pass.runner_protocols (or the class it is)"


def test_the_probe_scan_sees_a_probe() -> None:
    """The scans above would see what they forbid."""
    probe = ast.parse("def f(handle):\n    return hasattr(handle, 'estep') or getattr(self.runner, 'rank', 0)")
    calls = [n for n in ast.walk(probe) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert sum(_names_collaborator(c.args[0]) for c in calls) == 2
    typed = ast.parse("def f(runner: Any) -> None: ...")
    (arg,) = [n for n in ast.walk(typed) if isinstance(n, ast.arg)]
    assert arg.arg in COLLABORATORS and isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Any"


FAMILIES = {
    # runner class (module of executors.estimation.backends): its family base in backends.runner_families
    ("local", "LocalChunkRunner"): "ProcessPoolRunner",
    ("mp", "MPChunkRunner"): "ProcessPoolRunner",
    ("resilient_mp", "ResilientMPChunkRunner"): "ProcessPoolRunner",
    ("dask", "DaskRunner"): "ActorClusterRunner",
    ("ray", "RayRunner"): "ActorClusterRunner",
    ("mpi", "MPIRunner"): "SPMDRunner",
    ("torchrun", "TorchRunRunner"): "SPMDRunner",
}
"""Spark is a family of one (no family base): it shares the common bases, checked below."""


def _backend_module(module: str) -> object:
    return importlib.import_module(f"mixle_parallel.executors.estimation.backends.{module}")


@pytest.mark.parametrize(("runner", "family"), sorted(FAMILIES.items()), ids=lambda v: str(v))
def test_each_built_in_runner_is_of_its_family(runner: tuple[str, str], family: str) -> None:
    families = _backend_module("runner_families")
    cls = getattr(_backend_module(runner[0]), runner[1])
    assert issubclass(cls, getattr(families, family)), f"{runner[1]} is not a {family}"
    others = {"ProcessPoolRunner", "ActorClusterRunner", "SPMDRunner"} - {family}
    assert not any(issubclass(cls, getattr(families, o)) for o in others)
    placing = getattr(families, "PlacesWork" if cls.supports_worker_placement else "DeclinesPlacement")
    assert issubclass(cls, placing)


def test_runners_without_a_process_are_instances_of_their_family() -> None:
    """The pools build without starting a worker: their instances are of the family (the others need a cluster)."""
    families = _backend_module("runner_families")
    local, mp = _backend_module("local").LocalChunkRunner(2), _backend_module("mp").MPChunkRunner(2)
    try:
        assert isinstance(local, families.ProcessPoolRunner) and isinstance(mp, families.ProcessPoolRunner)
    finally:
        local.close()
        mp.close()


def test_spark_shares_the_common_bases() -> None:
    families = _backend_module("runner_families")
    spark = _backend_module("spark").SparkRunner
    assert issubclass(spark, families.CountedTransport) and issubclass(spark, families.DeclinesPlacement)
    assert not issubclass(spark, (families.ProcessPoolRunner, families.ActorClusterRunner, families.SPMDRunner))
