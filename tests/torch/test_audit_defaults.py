"""The production audit means something by default (issue 34 item 5).

Under the default policy (``raise_defects``) a ``backend_defect`` finding stops the run with
``BackendDefectError``, recorded in the ledger with action ``raise``; a ``device`` fault is recorded and
the run goes on; ``audit_policy="warn"`` remains the explicit choice to go on after a defect.
"""

from __future__ import annotations

from typing import Any

import pytest

from mixle_parallel.contracts import AuditPolicy
from mixle_parallel.executors.training_options import AuditOptions
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, read_ledger
from mixle_parallel.verification.ledger.verify import verify_ledger
from mixle_parallel.verification.sdc import BackendDefectError
from tests.torch.test_sdc_reference import _batches, _cheat, _session


def _audits(path: Any) -> list[dict]:
    return [e.payload["record"]["data"] for e in read_ledger(path).entries if e.kind == "audit"]


def test_the_default_policy_stops_a_backend_defect_and_records_it(tmp_path):
    assert AuditOptions().policy is AuditPolicy.RAISE_DEFECTS
    ledger = Ledger(tmp_path / "train.jsonl")
    session = _session(ledger=ledger)  # no audit_policy: the default
    _cheat(session)
    x, y = _batches(1)[0]
    with pytest.raises(BackendDefectError, match="backend defect"):
        session.train_batch(x, y)
    assert session.step == 0 and all(p.grad is None for p in session.module.parameters())  # nothing committed
    session.close()
    defects = [a for a in _audits(ledger.path) if a["cause"] == "backend_defect"]
    assert defects and all(a["action"] == "raise" for a in defects)
    assert verify_ledger(ledger.path).ok


def test_warn_remains_an_explicit_choice(tmp_path):
    session = _session(audit_policy="warn")
    _cheat(session)
    for x, y in _batches(2):
        session.train_batch(x, y)
    assert session.step == 2
    assert any(r.cause == "backend_defect" and r.action == "warn" for r in session.audit_records)
    session.close()


def test_a_device_fault_under_the_default_is_recorded_and_the_run_goes_on():
    injector = FaultInjector([BitFlip("gradient", "*", rank=0, step=1, index=3, bit=20)])
    session = _session(fault_injector=injector)
    for x, y in _batches(3):
        session.train_batch(x, y)
    bad = [r for r in session.audit_records if not r.matched]
    assert {(r.step, r.replay, r.cause) for r in bad} == {(1, "same_rank", ""), (1, "reference", "device")}
    assert all(r.action == "warn" for r in bad) and session.step == 3
    session.close()
