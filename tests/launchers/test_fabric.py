"""Lightning Fabric: 2 CPU ranks with the ddp strategy, attestation bound at launch, group destroyed at exit."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_fabric_ranks_are_bound_and_release_the_group(fabric_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(fabric_records, tiny_ddp.PLAN, "lightning_fabric")
    for record in fabric_records:
        assert record["local_rank"] == record["rank"]
        assert record["process_group_destroyed"] is True
