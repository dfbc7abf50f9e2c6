"""Ray Train: one TorchTrainer worker per plan rank on a local 2-CPU Ray, each handed its attestation."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_ray_workers_are_bound_to_plan_coordinates(ray_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(ray_records, tiny_ddp.PLAN, "ray_train")
    assert sorted(r["local_rank"] for r in ray_records) == [0, 1]
