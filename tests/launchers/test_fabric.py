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


def test_fabric_launching_rank_reports_a_failed_child(tmp_path: Any) -> None:
    import subprocess
    import sys

    from .conftest import JOBS, TIMEOUT_S, child_env

    # rank 1 (a child Fabric started) raises; rank 0 returns normally and must still fail
    done = subprocess.run([sys.executable, str(JOBS), "fabric_rank1_fails"], env=child_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0
    assert "boom on rank 1" in done.stderr
    assert "ranks started by Fabric failed" in done.stderr
