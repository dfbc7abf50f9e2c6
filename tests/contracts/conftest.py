"""Builders of valid contracts that the rule tests mutate one field at a time."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from mixle_parallel.contracts import AdmissionCertificate, BackendCapabilities, ParallelPlan, Tolerance

DIGEST = "sha256:" + "ab" * 32


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
        library_versions={"torch": "2.13.0"},
        evidence_digests={DIGEST},
        tolerance=Tolerance(1e-5, 1.3e-6, False, "torch.testing defaults"),
        issued_at="2026-11-30T09:00:00+00:00",
    )
    fields.update(changes)
    return AdmissionCertificate(**fields)


@attrs.frozen
class ToyExecutor:
    """The smallest object check_admission accepts: capabilities and a version."""

    capabilities: BackendCapabilities = BackendCapabilities("toy", {"dp_shard", "tp"})
    version: str = "1.0"


@pytest.fixture
def toy_executor() -> ToyExecutor:
    return ToyExecutor()
