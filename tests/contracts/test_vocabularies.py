"""The shared vocabularies: audit policies, admission modes and the device -> communication backend rule."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import (
    EM_AUDIT_POLICIES,
    TRAINING_AUDIT_POLICIES,
    AdmissionMode,
    AuditPolicy,
    choose,
    comm_backend_for,
)


def test_choose_takes_a_member_or_its_string_and_names_the_option_when_refusing() -> None:
    assert choose(AuditPolicy, "warn", option="audit_policy") is AuditPolicy.WARN
    assert choose(AuditPolicy, AuditPolicy.QUARANTINE, option="audit_policy") is AuditPolicy.QUARANTINE
    assert choose(AdmissionMode, "certified", option="mode") == "certified"  # a StrEnum compares as its value
    with pytest.raises(ValueError, match=r"audit_policy='quarantine' is not one of 'warn', 'raise', 'skip_step'"):
        choose(AuditPolicy, "quarantine", option="audit_policy", allowed=TRAINING_AUDIT_POLICIES)
    with pytest.raises(ValueError, match="audit_policy='skip_step'"):
        choose(AuditPolicy, "skip_step", option="audit_policy", allowed=EM_AUDIT_POLICIES)


@pytest.mark.parametrize(("device", "backend"), [("cuda", "nccl"), ("cuda:1", "nccl"), ("cpu", "gloo"),
                                                 ("mps", "gloo")])
def test_comm_backend_for_device_kinds(device: str, backend: str) -> None:
    assert comm_backend_for(device) == backend


def test_comm_backend_for_reads_a_device_object_and_refuses_other_things() -> None:
    torch = pytest.importorskip("torch", reason="needs the [torch] extra")
    assert comm_backend_for(torch.device("cpu")) == "gloo"
    with pytest.raises(TypeError, match="device kind"):
        comm_backend_for(3)
