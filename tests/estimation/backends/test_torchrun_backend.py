"""EM over torch.distributed under real ``torchrun --nproc-per-node 2`` and ``3`` (gloo): same bits as local."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data, optimize
from mixle_parallel.contracts.estimation import statistic_digest
from tests.estimation.backends.torchrun_scripts.em_torchrun import data

SCRIPT = pathlib.Path(__file__).resolve().parent / "torchrun_scripts" / "em_torchrun.py"
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _run(world: int, out: pathlib.Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(world), str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.count("fitted on") == 1  # torchrun_out: only the root prints
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def local_fit():
    x = data()
    est = MixtureEstimator([GaussianEstimator()] * 3)
    model = optimize(x, est, max_its=6, seed=3, num_chunks=12)
    with encoded_data(x, estimator=est, num_chunks=12) as h:
        return repr(model), h.pysp_seq_log_density_sum(model)[1], statistic_digest(h.estep(est, model).stats)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_fit_has_the_bits_of_local_on_every_rank(world, tmp_path, local_fit):
    ranks = _run(world, tmp_path)
    model, ll, digest = local_fit
    for r in ranks:
        assert r["world"] == world
        assert (r["model"], r["ll"], r["digest"]) == (model, ll, digest)
        assert r["root_only_model"] == model
        assert r["mixle_form_model"] == model and r["mixle_form_type"] == "TorchRunEncodedData"
        # the handle's own records: each rank computed its block of the 12 chunks in every pass
        last = [rec for rec in r["records"] if rec[1] == 0]
        assert sorted(rec[0] for rec in last) == list(range(world))
        assert sum(rec[2] for rec in last) == 12 and sum(rec[3] for rec in last) == 6000
    # the fixed binomial tree: rank 0 hears from 1 (step 1), then 2 (step 2); others receive nothing
    expected = {2: [[1, 1]], 3: [[1, 1], [2, 2]]}[world]
    assert ranks[0]["steps"] == expected and all(r["steps"] == [] for r in ranks[1:])


def test_torchrun_outside_a_job_is_a_world_of_one_process_with_the_local_bits(monkeypatch, local_fit):
    for k in _DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    x, est = data(), MixtureEstimator([GaussianEstimator()] * 3)
    model = optimize(x, est, max_its=6, seed=3, num_chunks=12, backend="torchrun")
    with encoded_data(x, estimator=est, num_chunks=12, backend="torchrun") as h:
        assert h.runner.single_process and h.num_workers == 1 and len(h) == len(x)
        ll = h.pysp_seq_log_density_sum(model)[1]
        assert (repr(model), ll, statistic_digest(h.estep(est, model).stats)) == local_fit


def test_a_half_torchrun_environment_says_how_to_start_one(monkeypatch):
    for k in _DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched-looking, but no RANK: not a job we can join
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node N"):
        encoded_data([0.0, 1.0], estimator=GaussianEstimator(), backend="torchrun", admission="unverified")
