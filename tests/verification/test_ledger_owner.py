"""One object owns a run's ledger: the session or the EM handle writes it; audits only return what they found."""

from __future__ import annotations

import inspect
import pathlib
from typing import Any

import numpy as np
import pytest

from mixle_parallel.executors.estimation import encoded_data
from mixle_parallel.executors.estimation.audit.sdc_audit import EMAudit
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, SDCDetectedError, read_ledger, verify_ledger
from mixle_parallel.verification.sdc.em import EMAuditor
from mixle_parallel.verification.sdc.training import TrainingAuditor
from tests.estimation.audit.audit_cases import start_model
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    """1,440 rows (24 chunks of 60) from three 1-D Gaussians."""
    rng = np.random.default_rng(17)
    return np.concatenate([rng.normal(-4, 1.0, 480), rng.normal(0, 0.5, 480), rng.normal(5, 1.5, 480)])


@pytest.fixture(scope="module")
def start(rows: np.ndarray) -> Any:
    """A fixed random start."""
    return start_model(rows)


def _has_no_ledger(obj: Any) -> bool:
    return not any("ledger" in name for name in vars(obj))


def _kinds(path: pathlib.Path) -> list[str]:
    return [e.kind for e in read_ledger(path).entries]


def _audit_payloads(path: pathlib.Path) -> list[Any]:
    return [e.payload for e in read_ledger(path).entries if e.kind == "audit"]


def test_audits_take_no_ledger() -> None:
    for cls in (EMAuditor, TrainingAuditor, EMAudit):
        assert "ledger" not in inspect.signature(cls).parameters, cls
    from mixle_parallel.executors.torch.health import SessionHealth
    from mixle_parallel.executors.torch.sdc_audit import SessionAudit

    for cls in (SessionAudit, SessionHealth):
        assert "ledger" not in inspect.signature(cls).parameters, cls
    assert _has_no_ledger(EMAuditor(rate=1.0)) and _has_no_ledger(TrainingAuditor())
    with pytest.raises(TypeError):
        EMAuditor(rate=1.0, ledger=object())  # type: ignore[call-arg]


def test_audited_em_fit_ledger_is_written_by_the_handle(rows: np.ndarray, start: Any, tmp_path: pathlib.Path) -> None:
    ledger = Ledger(tmp_path / "em.jsonl")
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=3,
                      audit_rate=0.5, ledger=ledger) as handle:
        assert _has_no_ledger(handle.audit) and _has_no_ledger(handle.audit.auditor)
        model = start
        for _ in range(3):
            model = handle.estep(estimator(), model).model
        records = handle.audit_records
        assert records and handle.audit.take_events() == ()  # everything found was handed to the handle
    kinds = _kinds(ledger.path)
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("receipt") == 3
    assert len(_audit_payloads(ledger.path)) == len(records)
    assert verify_ledger(ledger.path).ok


def test_em_mismatch_that_raises_still_reaches_the_ledger(rows: np.ndarray, start: Any,
                                                           tmp_path: pathlib.Path) -> None:
    """The fit raises on the mismatch (policy ``raise``); its audit records are in the ledger all the same."""
    ledger = Ledger(tmp_path / "two.jsonl")
    injector = FaultInjector([BitFlip("statistic", "chunk:0", rank=0, step=0, index=0, bit=40)])
    with pytest.raises(SDCDetectedError):
        with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=2,
                          audit_rate=1.0, audit_policy="raise", fault_injector=injector, ledger=ledger) as handle:
            handle.estep(estimator(), start)
    audits = _audit_payloads(ledger.path)
    assert audits and any(not a["record"]["data"]["matched"] for a in audits)
    assert verify_ledger(ledger.path).ok


def test_audited_training_step_ledger_is_written_by_the_session(tmp_path: pathlib.Path) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import global_batches, make_model

    ledger = Ledger(tmp_path / "train.jsonl")
    session = get_training_backend("torch_native").prepare(
        make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1, audit_rate=1.0, audit_policy="warn",
        ledger=ledger, admission="unverified")
    assert session._audit is not None and _has_no_ledger(session._audit)
    for per_rank in global_batches(3, [4], seed=5):
        session.train_batch(*per_rank[0])
    records = session.audit_records
    session.close()
    kinds = _kinds(ledger.path)
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("receipt") == 3
    assert records and len(_audit_payloads(ledger.path)) == len(records)
    assert kinds.index("audit") < kinds.index("receipt")  # a step's audit records precede its receipt
    assert verify_ledger(ledger.path).ok


def test_quarantine_note_follows_its_audit_records(rows: np.ndarray, start: Any, tmp_path: pathlib.Path) -> None:
    ledger = Ledger(tmp_path / "three.jsonl")
    injector = FaultInjector([BitFlip("statistic", "chunk:0", rank=0, step=0, index=0, bit=40)])
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=3,
                      audit_rate=1.0, fault_injector=injector, ledger=ledger) as handle:
        handle.estep(estimator(), start)
        assert handle.quarantined == frozenset({0})
    entries = read_ledger(ledger.path).entries
    note = next(i for i, e in enumerate(entries) if e.kind == "note" and "quarantined" in e.payload["message"])
    before = [e for e in entries[:note] if e.kind == "audit"]
    # the failed reference comparison (the witness since the driver's reference replaced the peer replay) is in the
    # ledger before the note that acts on it
    failed = [a.payload["record"]["data"] for a in before if not a.payload["record"]["data"]["matched"]]
    assert [(r["replay"], r["unit"], r["cause"], r["attributed_rank"]) for r in failed] == [
        ("reference", "chunk:0", "device", 0)]
    assert entries[note].payload["extra"] == {"worker": 0, "chunk": 0, "iteration": 0}
    assert verify_ledger(ledger.path).ok


def test_fatal_health_anomaly_run_end_is_written_by_the_session(tmp_path: pathlib.Path) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from mixle_parallel.executors.torch.health import HealthOptions
    from mixle_parallel.verification.health import Anomaly
    from tests.torch._models import make_model

    ledger = Ledger(tmp_path / "health.jsonl")
    session = get_training_backend("torch_native").prepare(
        make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1, audit=False, ledger=ledger,
        admission="unverified", health=HealthOptions(on_failure="raise"))
    health = session._health
    assert health is not None and _has_no_ledger(health) and health.on_fatal is not None
    health._failed(Anomaly(step=2, kind="dead_rank", value=1.0, baseline=None, z_score=None, detected_at_step=2,
                           rank=1, detail="test"))
    entries = read_ledger(ledger.path).entries
    assert [e.kind for e in entries] == ["run_start", "run_end"]
    assert entries[-1].payload["status"] == "failed" and entries[-1].payload["extra"]["health"]["rank"] == 1
