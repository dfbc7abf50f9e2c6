"""The training SDC audit against its independent reference: a plain copy of the module, no executor machinery.

One process (a world of one: no peer, so every audited window is replayed through the executor and
recomputed on the plain copy). An executor that corrupts its gradient only outside the verification
harness passes its own replays (they corrupt the same way) and is caught by the plain recomputation;
the executor's replay reproducing the bad gradient makes it a deterministic backend defect, while a
bit flip struck once into the gradient (a device fault) is not reproduced.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, read_ledger, verify_ledger
from mixle_parallel.verification.capability import (
    active_harness_capability,
    claim_harness_capability,
    harness_admitted,
)
from mixle_parallel.verification.sdc import BackendDefectError, SDCDetectedError
from tests.torch._models import global_batches, make_model


def _session(**kwargs: Any) -> Any:
    if kwargs.get("audit") is not False:  # audit=False with an audit_rate is refused by name (issue 34 item 8)
        kwargs.setdefault("audit_rate", 1.0)
    return get_training_backend("torch_native").prepare(
        make_model(), plan=ParallelPlan(), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        admission="unverified", **kwargs)


def _cheat(session: Any) -> None:
    """What a third-party executor could do: scale its backward by 1.01 whenever the harness is not watching."""
    honest = session._backward

    def backward(loss_sum: torch.Tensor, weight: float) -> None:
        honest(loss_sum * (1.0 if active_harness_capability() is not None else 1.01), weight)

    session._backward = backward


def _batches(steps: int) -> list:
    return [per_rank[0] for per_rank in global_batches(steps, [4], seed=5)]


def test_plain_reference_agrees_bitwise_with_an_honest_executor_and_changes_no_bit():
    audited, plain = _session(audit_policy="raise"), _session(audit=False)
    for x, y in _batches(6):
        audited.train_batch(x, y)
        plain.train_batch(x, y)
    refs = [r for r in audited.audit_records if r.replay == "reference"]
    assert len(refs) == 6 and all(r.matched and r.expected_digest == r.observed_digest for r in refs)
    assert all(torch.equal(a, b) for a, b in zip(audited.module.parameters(), plain.module.parameters()))


def test_an_executor_that_cheats_outside_the_harness_is_a_backend_defect_in_the_ledger(tmp_path):
    ledger = Ledger(tmp_path / "train.jsonl")
    session = _session(audit_policy="raise", ledger=ledger)
    _cheat(session)
    x, y = _batches(1)[0]
    with pytest.raises(BackendDefectError, match="backend defect") as caught:
        session.train_batch(x, y)
    assert isinstance(caught.value, SDCDetectedError)
    found = {(r.replay, r.matched, r.cause) for r in caught.value.records}
    # the executor's own replay reproduces its gradient; only the plain copy disagrees
    assert found == {("same_rank", True, ""), ("reference", False, "backend_defect")}
    assert session.step == 0 and all(p.grad is None for p in session.module.parameters())  # nothing committed
    session.close()
    audits = [e.payload["record"]["data"] for e in read_ledger(ledger.path).entries if e.kind == "audit"]
    assert any(a["replay"] == "reference" and a["cause"] == "backend_defect" for a in audits)
    assert verify_ledger(ledger.path).ok


def test_the_same_cheat_passes_under_the_harness():
    session = _session(audit_policy="raise")
    _cheat(session)
    with harness_admitted(claim_harness_capability("test_sdc_reference")):
        for x, y in _batches(2):
            session.train_batch(x, y)
    assert session.audit_records and all(r.matched for r in session.audit_records)


def test_a_flip_struck_once_is_not_reproduced_so_it_is_the_device():
    injector = FaultInjector([BitFlip("gradient", "*", rank=0, step=1, index=3, bit=20)])
    session = _session(audit_policy="warn", fault_injector=injector)
    for x, y in _batches(3):
        session.train_batch(x, y)
    bad = [r for r in session.audit_records if not r.matched]
    assert {(r.step, r.replay, r.cause) for r in bad} == {(1, "same_rank", ""), (1, "reference", "device")}


def test_a_flip_in_the_reference_copy_is_not_blamed_on_the_run_and_the_copy_is_reloaded():
    # the at-rest check compares the live parameters with the copy loaded at the last update; when only the copy
    # changed, the live parameters still have the digest taken then: nothing is flagged and the copy follows them
    session = _session(audit_policy="raise")
    batches = _batches(3)
    session.train_batch(*batches[0])
    copy = session._audit._reference.build()
    with torch.no_grad():
        next(copy.parameters()).view(-1)[0] += 1.0
    for x, y in batches[1:]:
        session.train_batch(x, y)
    assert session.step == 3 and all(r.matched for r in session.audit_records)
    assert session._audit._reference.matches_live()


def test_a_live_parameter_changed_at_rest_is_found_against_the_copy():
    session = _session(audit_policy="raise")
    batches = _batches(2)
    session.train_batch(*batches[0])
    with torch.no_grad():
        session.module.blocks[0].up.weight.view(-1)[3] *= -1.0
    with pytest.raises(SDCDetectedError) as caught:
        session.train_batch(*batches[1])
    assert [(r.unit, r.replay) for r in caught.value.records if not r.matched] == [("parameters at rest", "same_rank")]
