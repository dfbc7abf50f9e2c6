"""The EM wing's seams hold (issue 33, DESIGN §9): read from the source with ``ast``, nothing is imported.

The audit's state class stays under 300 lines (its placed rounds, peer replays, mixle's named draw and its
findings live in modules of their own); no collaborator (runner, handle, audit, session, ledger) is probed by a
name with ``hasattr``/``getattr`` (a runtime-checkable Protocol of ``em_pass.runner_protocols`` is checked
instead); and no parameter or attribute named for a collaborator is typed ``Any``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ESTIMATION = ROOT / "executors" / "estimation"
COLLABORATORS = {"runner", "handle", "audit", "session", "ledger"}
MAX_AUDIT_CLASS_LINES = 300


def _trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8")) for p in ESTIMATION.rglob("*.py")}


def _names_collaborator(node: ast.expr) -> bool:
    """``runner`` / ``handle`` / ... or ``self.runner`` / ``self._audit`` / ..."""
    if isinstance(node, ast.Name):
        return node.id in COLLABORATORS
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr.lstrip("_") in COLLABORATORS)


def test_the_audit_state_class_stays_under_300_lines() -> None:
    tree = ast.parse((ESTIMATION / "audit" / "sdc_audit.py").read_text(encoding="utf-8"))
    (audit,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EMAudit"]
    assert audit.end_lineno is not None
    assert audit.end_lineno - audit.lineno + 1 <= MAX_AUDIT_CLASS_LINES


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
