"""Each launcher runs the tiny DDP example once per test session; the slow tests read its per-rank records.

Real processes throughout: torchrun starts 2 ranks, Lightning Fabric's ``ddp`` launcher starts 2
CPU ranks, Ray Train starts 2 CPU workers on the session's local Ray (``ray_session`` in
tests/conftest.py: ``num_cpus=2``, shut down at the end of the session). Generous timeouts: the CI
machine may be loaded.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from ._examples import EXAMPLES, load_example

JOBS = pathlib.Path(__file__).resolve().parent / "_jobs.py"
TIMEOUT_S = 600
# torchrun/torch.distributed variables a launching process must not pass on to the job it starts
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_env() -> dict[str, str]:
    """The environment for a launched job: ours minus any distributed-job variables."""
    return {k: v for k, v in os.environ.items() if k not in _DIST_ENV}


def read_records(out_dir: pathlib.Path, world_size: int) -> list[dict[str, Any]]:
    """The per-rank JSON records an example wrote, in rank order."""
    found = sorted(p.name for p in out_dir.iterdir())
    assert found == [f"rank{r}.json" for r in range(world_size)], found
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture(scope="session")
def tiny_ddp() -> Any:
    """The shared example body (model, data, train, reference)."""
    return load_example("tiny_ddp")


@pytest.fixture(scope="session")
def torchrun_records(tmp_path_factory: pytest.TempPathFactory, tiny_ddp: Any) -> list[dict[str, Any]]:
    """torchrun --standalone --nproc-per-node 2 examples/launchers/torchrun_ddp.py OUT."""
    from mixle_parallel.executors import TorchrunLauncher

    out = tmp_path_factory.mktemp("torchrun")
    launcher = TorchrunLauncher(tiny_ddp.PLAN)
    command = launcher.command(EXAMPLES / "torchrun_ddp.py", str(out))
    # the torchrun console script is `python -m torch.distributed.run`; spelled with this interpreter
    assert command[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    launcher.run(EXAMPLES / "torchrun_ddp.py", str(out), env=child_env(), timeout_s=TIMEOUT_S)
    return read_records(out, tiny_ddp.PLAN.world_size)


@pytest.fixture(scope="session")
def fabric_records(tmp_path_factory: pytest.TempPathFactory, tiny_ddp: Any) -> list[dict[str, Any]]:
    """python examples/launchers/fabric_ddp.py OUT (Fabric's ddp launcher re-runs it for rank 1)."""
    out = tmp_path_factory.mktemp("fabric")
    done = subprocess.run([sys.executable, str(EXAMPLES / "fabric_ddp.py"), str(out)], env=child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return read_records(out, tiny_ddp.PLAN.world_size)


@pytest.fixture(scope="session")
def local_ray(ray_session: Any, tiny_ddp: Any) -> Any:
    """The session's local Ray with 2 CPUs (tests/conftest.py), shut down at the end of the session.

    Its workers have the repository root and examples/launchers on PYTHONPATH: they import the
    example module and tests.launchers._jobs (functions travel by reference).
    """
    return ray_session


@pytest.fixture(scope="session")
def ray_records(tmp_path_factory: pytest.TempPathFactory, tiny_ddp: Any, local_ray: Any) -> list[dict[str, Any]]:
    """The Ray example's launch(): 2 Ray Train CPU workers on the local Ray."""
    ray_ddp = load_example("ray_ddp")
    out = tmp_path_factory.mktemp("ray")
    records = ray_ddp.launch(str(out))
    assert read_records(out, tiny_ddp.PLAN.world_size) == records
    return records
