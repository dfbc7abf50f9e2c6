"""The EM reference audit on SPMD ranks (issue 23 item 5): real ``mpiexec -n 2`` and ``torchrun`` jobs.

Every rank agrees on the audited chunks (drawn with the root's secret), recomputes the reference of those it
owns (under ``root_only`` the root recomputes them all), and the references are shared, so every rank judges
the same and enters the same replays. An honest job passes with the same records on both ranks; a runner that
is honest under the harness (it certifies in situ) and computes on half-overwritten rows in production is
caught on every rank as a backend defect. Before, SPMD handles ran no reference audit: the cheat fitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.estimation.engines.engine_helpers import REPO_ROOT, mpi_env, mpiexec

pytestmark = pytest.mark.slow

MODULE = "tests.estimation.engines.mpi_scripts.audit_check"
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _launch(backend: str, tmp: Path, mode: str, root_only: bool = False) -> list[dict[str, Any]]:
    out = tmp / f"{backend}-{mode}-{int(root_only)}"
    out.mkdir(parents=True)
    if backend == "mpi":
        pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
        exe = mpiexec()
        if exe is None:
            pytest.skip("no mpiexec found: install the [mpi] extra (mpi4py + mpich)")
        command, env = [exe, "-n", "2", sys.executable, "-m", MODULE], mpi_env(exe)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                   MODULE]
        env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env = {**env, "MIXLE_PARALLEL_HOME": str(tmp / "home"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MIXLE_PARALLEL_CERTIFICATE", None)
    done = subprocess.run([*command, backend, str(out), mode, "1" if root_only else "0"], env=env,
                          cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("backend, root_only", [("mpi", False), ("mpi", True), ("torchrun", False)])
def test_an_honest_spmd_job_passes_the_reference_audit_the_same_on_every_rank(backend, root_only, tmp_path):
    ranks = _launch(backend, tmp_path, "honest", root_only)
    assert all("error" not in r and r["admission"] == "certified" for r in ranks), ranks
    assert ranks[0]["records"] == ranks[1]["records"] and ranks[0]["digest"] == ranks[1]["digest"]
    records = ranks[0]["records"]
    assert records and {r[0] for r in records} == {"reference"} and all(r[3] for r in records)


@pytest.mark.parametrize("backend", ["mpi", "torchrun"])
def test_a_runner_cheating_outside_the_harness_is_a_backend_defect_on_every_rank(backend, tmp_path):
    ranks = _launch(backend, tmp_path, "cheat")
    assert [r["admission"] for r in ranks] == ["certified", "certified"]  # it behaved under the harness
    assert [r.get("error") for r in ranks] == ["BackendDefectError", "BackendDefectError"], ranks
    assert ranks[0]["records"] == ranks[1]["records"]
    bad = [r for r in ranks[0]["records"] if not r[3]]
    assert [(r[0], r[4]) for r in bad] == [("reference", "backend_defect")]
