"""Checks every launcher's records must pass: each rank bound to its plan coordinate, one training."""

from __future__ import annotations

from typing import Any

from mixle_parallel.contracts import ParallelPlan


def check_bound_ranks(records: list[dict[str, Any]], plan: ParallelPlan, launcher: str) -> None:
    """Every launched rank carries the plan's attestation for its rank, and its process group agrees."""
    assert [r["rank"] for r in records] == list(range(plan.world_size))
    for record in records:
        assert record["launcher"] == launcher
        assert record["world_size"] == plan.world_size
        assert record["coordinate"] == plan.coordinate(record["rank"]).as_dict()
        assert record["process_group_rank"] == record["rank"]
        assert record["steps"] == 3
    # DDP: every rank ends with the same parameters and sees the same global losses
    assert all(r["params"] == records[0]["params"] for r in records)
    assert all(r["losses"] == records[0]["losses"] for r in records)
