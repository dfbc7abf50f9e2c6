"""MPIRunner under real `mpiexec -n 2` and `-n 3` (SPMD, root_only scatter, fixed-order results)."""

from __future__ import annotations

import pytest

pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")

from tests.estimation.backends.engine_helpers import run_mpi  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BLOCKS = {2: [[0, 1, 2], [3, 4, 5, 6]], 3: [[0, 1], [2, 3], [4, 5, 6]]}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("mode", ["all", "root_only"])
def test_mpi_runner_spmd(n, mode):
    rows = run_mpi("runner_check.py", n, mode)
    for rank, row in enumerate(rows):
        assert row["held"] == BLOCKS[n][rank]  # each rank holds only its contiguous block
        assert row["ok"] and row["subset_ok"] and row["root_payload_ok"]
        assert row["failed"] is not None and "rank " in row["failed"] and "bad on purpose" in row["failed"]
        names = [f"mpi:{r}" for r in range(n)]
        assert row["resources_comm"] == names  # Resources.from_mpi(comm)
        assert row["resources_env"] == names  # Resources.from_mpi() from the launcher's PMI_SIZE


@pytest.mark.parametrize("n", [2, 3])
def test_hung_rank_is_detected_by_timeout(n):
    """The last rank hangs in its chunk for 120 s; the others raise after 3 s and abort the job."""
    rows = run_mpi("hang_check.py", n, timeout=90, abort_on_error=True, check=False)
    # The first rank to time out aborts the job, possibly before another waiting rank writes.
    assert rows and all(r["rank"] < n - 1 for r in rows), rows
    for row in rows:
        assert "waited 3.0 s for the other ranks" in row["timeout"]
