"""The audit rates are named per family in one place (verification.sdc.schedule) and every default reads them."""

from __future__ import annotations

import ast
from pathlib import Path

from mixle_parallel.executors.training_options import AuditOptions
from mixle_parallel.verification import sdc
from mixle_parallel.verification.sdc.schedule import EM_AUDIT_RATE, TRAINING_AUDIT_RATE, AuditSchedule

ROOT = Path(__file__).resolve().parents[2]


def test_each_family_has_its_rate_with_todays_value():
    assert (TRAINING_AUDIT_RATE, EM_AUDIT_RATE) == (0.04, 0.05)
    assert sdc.TRAINING_AUDIT_RATE is TRAINING_AUDIT_RATE and sdc.EM_AUDIT_RATE is EM_AUDIT_RATE
    assert sdc.DEFAULT_AUDIT_RATE == EM_AUDIT_RATE  # the earlier public name, kept as an alias


def test_the_defaults_read_the_named_rates():
    assert AuditOptions().rate == TRAINING_AUDIT_RATE
    assert sdc.EMAuditor().rate == EM_AUDIT_RATE
    assert AuditSchedule().rate == EM_AUDIT_RATE


def test_no_module_defines_an_audit_rate_of_its_own():
    """Only schedule.py assigns a name ending in AUDIT_RATE (the alias included); everyone else imports it."""
    owners = set()
    for path in ROOT.rglob("*.py"):
        if any(part in {".venv", "tests", ".git", "build", "dist"} for part in path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id.endswith("AUDIT_RATE") for t in targets):
                owners.add(path.relative_to(ROOT).as_posix())
    assert owners == {"verification/sdc/schedule.py"}
