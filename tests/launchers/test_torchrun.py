"""torchrun: 2 ranks started by `torchrun --standalone --nproc-per-node 2`, each attested from its environment."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_torchrun_ranks_are_bound_to_plan_coordinates(torchrun_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(torchrun_records, tiny_ddp.PLAN, "torchrun")
    for record in torchrun_records:
        # Resources.from_torchrun: one slot per global rank
        assert record["resources"] == ["rank:0", "rank:1"]
        assert record["local_rank"] == record["rank"]
        # the group TorchrunLauncher.worker created is destroyed when the block exits
        assert record["process_group_destroyed"] is True
