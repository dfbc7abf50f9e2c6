"""Builders of valid contracts that the rule tests mutate one field at a time."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from mixle_parallel.contracts import (
    AdmissionCertificate,
    AdmissionContext,
    BackendCapabilities,
    NumericsEvidence,
    ParallelPlan,
    Tolerance,
)

DIGEST = "sha256:" + "ab" * 32
VERSIONS = {"python": "3.11.9", "numpy": "2.1.0", "torch": "2.13.0"}
ISSUED = "2026-11-30T09:00:00+00:00"


def make_evidence(plan: ParallelPlan, **changes: Any) -> NumericsEvidence:
    """A passing evidence record of the toy executor."""
    fields: dict[str, Any] = dict(
        node_id="grad:dp_shard", payload="gradient", executor="toy", plan=plan, precision="fp32", trials=2,
        sample_count=100, maximum_absolute_error=1e-7, maximum_relative_error=1e-6, deterministic=True,
        within_tolerance=True, tolerance=Tolerance(1e-5, 1.3e-6, False, "torch.testing defaults"))
    fields.update(changes)
    return NumericsEvidence(**fields)


def context(**changes: Any) -> AdmissionContext:
    """The run make_certificate() fits: cpu/gloo, the same versions, a day after issue."""
    from datetime import datetime, timedelta

    fields: dict[str, Any] = dict(library_versions=VERSIONS, now=datetime.fromisoformat(ISSUED) + timedelta(days=1))
    fields.update(changes)
    return AdmissionContext(**fields)


def make_certificate(**changes: Any) -> AdmissionCertificate:
    """A valid certificate for a toy executor on a dp_shard x tp plan, with ``changes`` applied."""
    plan = ParallelPlan(dp_shard=2, tp=2)
    fields: dict[str, Any] = dict(
        executor="toy",
        executor_version="1.0",
        capabilities=BackendCapabilities("toy", {"dp_shard", "tp"}),
        axis_family=plan.axis_family,
        measured_plan=plan,
        precision="fp32",
        source_digest=DIGEST,
        device_kind="cpu",
        comm_backend="gloo",
        library_versions=VERSIONS,
        tolerance=Tolerance(1e-5, 1.3e-6, False, "torch.testing defaults"),
        issued_at=ISSUED,
    )
    fields.update(changes)
    fields.setdefault("evidence", (make_evidence(plan),))
    fields.setdefault("evidence_digests", frozenset(e.evidence_id for e in fields["evidence"]))
    return AdmissionCertificate(**fields)


@attrs.frozen
class ToyExecutor:
    """The smallest object check_admission accepts: capabilities and a version."""

    capabilities: BackendCapabilities = BackendCapabilities("toy", {"dp_shard", "tp"})
    version: str = "1.0"


@pytest.fixture
def toy_executor() -> ToyExecutor:
    return ToyExecutor()
