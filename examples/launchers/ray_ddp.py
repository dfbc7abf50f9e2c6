"""Tiny DDP training with a torch_native session on two Ray Train workers (CPU).

Run:  python examples/launchers/ray_ddp.py OUT_DIR
Starts a local Ray with 2 CPUs, runs one worker per plan rank, writes OUT_DIR/rank<R>.json.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import tiny_ddp

from mixle_parallel.executors import RayTrainLauncher


def launch(out_dir: str) -> list[dict[str, Any]]:
    """Run the tiny training on one Ray Train worker per plan rank (Ray must be initialized)."""
    # admission="unverified": a launcher example, not a certified run (recorded in every worker's context)
    records = RayTrainLauncher(tiny_ddp.PLAN, use_gpu=False, admission="unverified").run(tiny_ddp.train)
    for record in records:
        pathlib.Path(out_dir, f"rank{record['rank']}.json").write_text(json.dumps(record))
    return records


if __name__ == "__main__":
    import ray

    ray.init(num_cpus=2)
    try:
        launch(sys.argv[1])
    finally:
        ray.shutdown()
