"""Shared fixtures for the verification tests."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import ParallelPlan


@pytest.fixture
def plan() -> ParallelPlan:
    """A 4-rank plan."""
    return ParallelPlan(dp_shard=2, tp=2)
