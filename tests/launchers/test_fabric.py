"""Lightning Fabric: 2 CPU ranks with the ddp strategy, attestation bound at launch, group destroyed at exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_fabric_ranks_are_bound_and_release_the_group(fabric_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(fabric_records, tiny_ddp.PLAN, "lightning_fabric")
    for record in fabric_records:
        assert record["local_rank"] == record["rank"]
        assert record["process_group_destroyed"] is True
        assert record["launch_admission"] == "unverified"  # the launch gate's decision, on every rank


def _run_job(job: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a Fabric job script in its own session; on timeout kill the whole session (no orphan ranks)."""
    from .conftest import JOBS, TIMEOUT_S, child_env

    proc = subprocess.Popen([sys.executable, str(JOBS), job, *args], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"Fabric job {job!r} did not finish within {TIMEOUT_S} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_fabric_launching_rank_reports_a_failed_child() -> None:
    # rank 1 (a child Fabric started) raises; rank 0 returns normally and must still fail
    done = _run_job("fabric_rank1_fails")
    assert done.returncode != 0
    assert "boom on rank 1" in done.stderr
    # Reported by our launcher when rank 0 returns first, or -- when Lightning's child observer (a
    # 5 s poll) sees the dead rank while rank 0 is still running, as happens under load -- by
    # Lightning, which then kills rank 0 itself. Either way the job fails and says which rank died.
    assert ("ranks started by Fabric failed" in done.stderr
            or ("Child process with PID" in done.stderr and "terminated with code 1" in done.stderr))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fabric_launching_rank_failure_stops_its_children(tmp_path: Any) -> None:
    # rank 0 raises while rank 1 is busy outside any collective: the launcher must stop rank 1
    # rather than leave it running on after the job has failed
    done = _run_job("fabric_rank0_fails", str(tmp_path))
    pid = int((tmp_path / "rank1.pid").read_text())
    try:
        assert done.returncode != 0
        assert "boom on rank 0" in done.stderr
        assert not _alive(pid), "rank 1 outlived the failed launch"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
