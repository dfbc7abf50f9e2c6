"""Stochastic EM on the engine backends (dask, ray, spark, mpi, torchrun): local's batch order and bits, the workers
supplying only the statistics of a batch's chunks (the shared session engines, 2 workers each)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from mixle_parallel import encoded_data
from tests.estimation.backends import stochastic_case as case
from tests.estimation.backends.engine_helpers import run_mpi


def _stochastic(backend: str, **options: Any) -> tuple[str, str, tuple[int, float]]:
    with encoded_data(case.data(), estimator=case.EST, backend=backend, admission="unverified", **case.MINIBATCH,
                      **options) as h:
        return case.signature(h)


REFERENCE = _stochastic("local")
REPO = pathlib.Path(__file__).resolve().parents[3]
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def test_the_local_reference_is_a_real_stochastic_fit():
    plans, model, (steps, passes) = REFERENCE
    assert (steps, passes) == (12, 1.5) and model != repr(case.START) and plans.startswith("[[[")


def test_dask(dask_client):
    assert _stochastic("dask", client=dask_client, num_workers=2) == REFERENCE


def test_ray(ray_session):
    assert _stochastic("ray", num_workers=2) == REFERENCE


@pytest.mark.slow  # each mini-batch is a Spark job: ~28 s on a loaded machine
def test_spark(spark_context):
    assert _stochastic("spark", client=spark_context, num_workers=2) == REFERENCE


@pytest.mark.mpi
@pytest.mark.parametrize("n, mode", [(2, "all"), (3, "root_only")])
def test_mpi(n, mode):
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    for row in run_mpi("stochastic_check.py", n, mode):
        assert row["size"] == n
        assert (row["plans"], row["model"], tuple(row["fit"])) == REFERENCE, f"rank {row['rank']} differs"


def test_root_only_without_a_batch_size_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="batch_size= is needed when this process does not hold the rows"):
        encoded_data(None, estimator=case.EST, backend="mpi", root_only=True, shuffle=True)


@pytest.mark.slow  # two torchrun ranks each import torch
def test_torchrun(tmp_path):
    script = pathlib.Path(__file__).resolve().parent / "torchrun_scripts" / "stochastic_torchrun.py"
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for r in range(2):
        row = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert row["world"] == 2 and (row["plans"], row["model"], tuple(row["fit"])) == REFERENCE, f"rank {r} differs"
