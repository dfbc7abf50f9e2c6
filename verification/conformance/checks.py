"""One pytest test per conformance check; collected by the plugin when --mixle-backend is given."""

from __future__ import annotations

from typing import Any

import pytest

from . import suite as conformance


@pytest.mark.parametrize("check", [c for c in conformance.CHECKS if c not in conformance.HARNESS_CHECKS],
                         ids=lambda c: c.__name__)
def test_contract(mixle_conformance: Any, check: Any, record_property: Any) -> None:
    """A contract check that needs no processes; what it measured goes into the JUnit report."""
    record_property("measured", str(check(mixle_conformance) or ""))


def test_harness_admits(mixle_conformance: Any, request: pytest.FixtureRequest, record_property: Any) -> None:
    """The verification harness admits the backend on a small real mesh."""
    if request.config.getoption("mixle_skip_harness"):
        pytest.skip("--mixle-skip-harness given")
    record_property("measured", conformance.check_harness_admits(mixle_conformance))


@pytest.mark.parametrize("check", [c for c in conformance.HARNESS_CHECKS if c is not conformance.check_harness_admits],
                         ids=lambda c: c.__name__)
def test_harness_evidence(mixle_conformance: Any, check: Any, request: pytest.FixtureRequest,
                          record_property: Any) -> None:
    """A check on the harness's report (receipts against the wire, declared updates on the wire)."""
    if request.config.getoption("mixle_skip_harness"):
        pytest.skip("--mixle-skip-harness given")
    record_property("measured", str(check(mixle_conformance) or ""))
