"""One collective schedule on every SPMD rank, whichever loop drives the handle (issue 33, item 5).

mixle 0.8.2's own ``optimize(None, est, enc_data=handle, prev_estimate=m0)`` (a log-density pass, then E-steps
and log-density passes in turn) drives ``MPIEncodedData`` under ``mpiexec -n 2``, a ``ModelParallelEstimator``
under ``mpiexec -n 3`` and ``TorchRunEncodedData`` under ``torchrun --nproc-per-node 2``, with the SDC audit on:
every rank ends on the same model, the bits of the same loop over a one-worker local handle. Then the ranks are
forced apart (rank 0 scores, the others run an E-step): every rank raises the same ``CollectiveScheduleError``
naming the pass each rank was in, never a ``TypeError`` from inside a chunk function.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from typing import Any

import pytest

from tests.estimation.backends.engine_helpers import REPO_ROOT, run_mpi

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _check(ranks: list[dict[str, Any]], world: int, estimator: str) -> None:
    assert [r["rank"] for r in ranks] == list(range(world)) and all(r["size"] == world for r in ranks)
    for r in ranks:
        assert r["estimator"] == estimator
        assert r["audited"] and r["audit_records"] >= 1 and r["audit_mismatches"] == 0, r  # the audit ran, clean
        assert r["esteps"] >= 2  # mixle's loop ran E-steps with log-density passes between them
        assert r["params"] == r["local"]  # the bits of the same loop over a one-worker local handle
    assert len({r["params"] for r in ranks}) == 1  # the same model on every rank
    assert len({r["steps"] for r in ranks}) == 1  # the same number of collective steps on every rank
    messages = {r["diverged"]["message"] for r in ranks}
    assert len(messages) == 1, messages  # the same error on every rank ...
    for r in ranks:
        assert r["diverged"]["error"] == "CollectiveScheduleError", r["diverged"]  # ... never a TypeError
        message = r["diverged"]["message"]
        assert "rank 0:" in message and "log-density pass" in message and "E-step" in message, message
        assert f"rank {world - 1}:" in message and "TypeError" not in message


@pytest.mark.mpi
@pytest.mark.slow
def test_mixle_optimize_drives_mpi_handle_on_two_ranks_in_one_schedule():
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    pytest.importorskip("mixle", reason="mixle is the optional [mixle] extra")
    ranks = run_mpi("mixle_optimize_check.py", 2, "plain", timeout=600, abort_on_error=True)  # an error aborts the job
    _check(ranks, 2, "MixtureEstimator")


@pytest.mark.mpi
@pytest.mark.slow
def test_mixle_optimize_drives_model_parallel_estimator_on_three_mpi_ranks_in_one_schedule():
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    pytest.importorskip("mixle", reason="mixle is the optional [mixle] extra")
    ranks = run_mpi("mixle_optimize_check.py", 3, "model_parallel", timeout=600, abort_on_error=True)
    _check(ranks, 3, "ModelParallelEstimator")


@pytest.mark.slow
def test_mixle_optimize_drives_torchrun_handle_on_two_ranks_in_one_schedule(tmp_path):
    pytest.importorskip("torch", reason="torch is the optional [torch] extra")
    pytest.importorskip("mixle", reason="mixle is the optional [mixle] extra")
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
         "tests.estimation.backends.torchrun_scripts.mixle_optimize_torchrun", str(tmp_path)],
        env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    _check([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)], 2, "MixtureEstimator")


def test_a_chunk_result_and_its_transported_copy_commit_to_one_digest():
    """The root cause: ``pickle.dumps`` of mixle's statistics (numpy scalars beside an array) differed between a
    rank's own result and a peer's unpickled copy, so the ranks judged the same chunk differently."""
    pytest.importorskip("mixle.stats", reason="mixle is the optional [mixle] extra")
    import numpy as np

    from mixle_parallel.executors.estimation.compat.mixle_interop import adapt_mixle_objects
    from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk, chunk_estep
    from mixle_parallel.executors.estimation.em_pass.combine_order import commit_digest
    from tests.estimation.backends import em_case, spmd_mixle_loop

    est, model, _ = adapt_mixle_objects(*spmd_mixle_loop.mixle_objects(False), None)
    rows = em_case.data()[2500:2750]
    result = chunk_estep(EncodedChunk(10, 2500, 2750, est.encoder().encode(rows)), (est, model))
    for copy in (pickle.loads(pickle.dumps(result, protocol=5)), pickle.loads(pickle.dumps(result, protocol=4))):
        assert commit_digest(copy) == commit_digest(result)
    view = np.arange(12.0).reshape(3, 4)[:, 1]  # a strided view and its contiguous copy: the same value
    assert commit_digest((view, 1.0)) == commit_digest((pickle.loads(pickle.dumps(view, protocol=5)), 1.0))
    flipped = (result[0], result[1], (result[2][0] + 1e-300, result[2][1]))
    assert commit_digest(flipped) != commit_digest(result)  # still a digest of the bits
