"""Failing jobs for the launcher failure tests; run as a script (torchrun, Fabric) or imported by Ray workers.

    python -m torch.distributed.run ... _jobs.py world4     every rank binds a world-4 plan in a world of 2
    python _jobs.py fabric_rank1_fails                       Fabric rank 1 raises, rank 0 returns
    python _jobs.py fabric_rank0_fails PID_DIR               Fabric rank 0 raises, rank 1 is still working
"""

from __future__ import annotations

import sys
from typing import Any

from mixle_parallel.contracts import ParallelPlan


def fail_on_rank1(context: Any) -> int:
    """Raise on rank 1 before any collective; return the rank elsewhere."""
    if context.rank == 1:
        raise ValueError(f"boom on rank {context.rank} at {context.coordinate.as_dict()}")
    return context.rank


def fail_on_rank0_while_rank1_works(context: Any, pid_dir: str) -> int:
    """Rank 1 records its pid and keeps working (sleeps); rank 0 raises once that pid is recorded."""
    import os
    import pathlib
    import time

    pid_file = pathlib.Path(pid_dir, "rank1.pid")
    if context.rank == 1:
        pid_file.write_text(str(os.getpid()))
        time.sleep(300)
        return 1
    deadline = time.monotonic() + 300
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    raise ValueError("boom on rank 0")


def mixle_config_loop(config: dict[str, Any]) -> None:
    """mixle's ``train_loop_per_worker(config)``: record the plan and attestation Ray's worker was handed."""
    import json
    import pathlib

    import torch.distributed as dist

    att = config["mixle_worker_topology_attestation"]
    record = {"plan": config["mixle_parallel_plan"], "attestation": att, "mine": config["mine"],
              "group": [dist.get_rank(), dist.get_world_size()]}
    pathlib.Path(config["out"], f"rank{att['rank']}.json").write_text(json.dumps(record))


def main(job: str, *args: str) -> None:
    """Run one named failing job."""
    if job == "world4":
        from mixle_parallel.executors import TorchrunLauncher

        with TorchrunLauncher.worker(ParallelPlan(dp_replicate=4)):
            raise AssertionError("a world-4 plan was bound in a world of 2")
    elif job == "fabric_rank1_fails":
        from mixle_parallel.executors import LightningFabricLauncher

        launcher = LightningFabricLauncher(ParallelPlan(dp_replicate=2), accelerator="cpu", admission="unverified")
        launcher.launch(fail_on_rank1)
    elif job == "fabric_rank0_fails":
        from mixle_parallel.executors import LightningFabricLauncher

        LightningFabricLauncher(ParallelPlan(dp_replicate=2), accelerator="cpu", admission="unverified").launch(
            fail_on_rank0_while_rank1_works, args[0]
        )
    else:
        raise SystemExit(f"unknown job {job!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
