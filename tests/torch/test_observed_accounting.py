"""Receipts report the collectives really issued: compared per call with PyTorch's flight recorder (5%),
and a DDP whose no_sync is broken shows its extra all-reduces on the non-commit micro-steps."""

from __future__ import annotations

from typing import Any

import pytest

from mixle_parallel.verification.harness.mesh import MeshError, run_world
from tests.torch._world import WORLD_TIMEOUT_S

_MODULE = "tests.torch._accounting_scenarios"


def _scenario(rank: int, world_size: int, function: str) -> Any:
    import importlib

    return getattr(importlib.import_module(_MODULE), function)()


def _world(size: int, function: str) -> list[dict[str, Any]]:
    try:
        return run_world(_scenario, size, function, timeout=WORLD_TIMEOUT_S, backend="gloo", group_timeout_s=300.0,
                         env={"TORCH_FR_BUFFER_SIZE": "20000"})
    except MeshError as err:
        raise AssertionError(f"a rank failed: {err}") from None


@pytest.fixture(scope="module")
def world2() -> list[dict[str, Any]]:
    return _world(2, "world2")


def _within_5_percent(calls: list[dict[str, Any]], case: str) -> None:
    for i, call in enumerate(calls):
        got, recorded = call["receipt"]["collective_bytes"], call["recorded_bytes"]
        seen = (call["recorded_counts"], call["receipt"]["extra"]["collectives"], call["recorded_entries"])
        assert abs(got - recorded) <= 0.05 * recorded, (case, i, got, recorded, seen)


@pytest.mark.parametrize("case", ["ddp_accum", "fsdp", "tp", "cp"])
def test_receipt_bytes_match_the_flight_recorder(world2: list[dict[str, Any]], case: str) -> None:
    for rank in world2:
        assert all(call["recorded_bytes"] > 0 for call in rank[case][1::2]), case  # commits communicate
        _within_5_percent(rank[case], case)


def test_ddp_receipts_count_the_all_reduces_really_issued(world2: list[dict[str, Any]]) -> None:
    for rank in world2:
        calls = rank["ddp_accum"]
        grad_bytes = calls[0]["grad_bytes"]
        non_commit, commit = calls[0], calls[1]
        assert "all_reduce" not in non_commit["recorded_counts"]
        assert "all_reduce" not in non_commit["receipt"]["extra"]["collectives"]
        assert non_commit["receipt"]["collective_bytes"] < 0.01 * grad_bytes
        # the bucket all-reduce (one bucket for the tiny model) + the session's metric all-reduce
        assert commit["receipt"]["extra"]["collectives"]["all_reduce"] == commit["recorded_counts"]["all_reduce"] == 2


def test_broken_no_sync_shows_the_extra_all_reduces(world2: list[dict[str, Any]]) -> None:
    for rank in world2:
        calls = rank["ddp_broken_no_sync"]
        grad_bytes = calls[0]["grad_bytes"]
        non_commit = calls[0]
        assert non_commit["recorded_counts"].get("all_reduce") == 1  # DDP really all-reduced
        assert non_commit["receipt"]["extra"]["collectives"].get("all_reduce") == 1  # and the receipt says so
        assert non_commit["receipt"]["collective_bytes"] >= grad_bytes
        _within_5_percent(calls, "ddp_broken_no_sync")


def test_ddp_buffer_broadcasts_are_counted_as_issued(world2: list[dict[str, Any]]) -> None:
    for rank in world2:
        calls = rank["ddp_buffers"]
        recorded = [call["recorded_counts"].get("broadcast", 0) for call in calls]
        # DDP broadcasts buffers before a forward that follows a synchronized one (not after a no_sync
        # micro-step), one broadcast per dtype bucket: the float32 mean and the float64 count
        assert recorded[0] == 2 and set(recorded) <= {0, 2}, [c["recorded_entries"] for c in calls]
        assert [call["receipt"]["extra"]["collectives"].get("broadcast", 0) for call in calls] == recorded
        _within_5_percent(calls, "ddp_buffers")


@pytest.mark.slow
def test_hsdp_receipt_bytes_match_the_flight_recorder() -> None:
    for rank in _world(4, "world4"):
        _within_5_percent(rank["hsdp"], "hsdp")
