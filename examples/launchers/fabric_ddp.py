"""Tiny DDP training with a torch_native session, launched by Lightning Fabric (``ddp`` strategy, CPU).

Run:  python examples/launchers/fabric_ddp.py OUT_DIR
Fabric re-runs this script for rank 1; every rank writes OUT_DIR/rank<R>.json.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tiny_ddp
import torch.distributed as dist

from mixle_parallel.executors import LightningFabricLauncher


def main(out_dir: str) -> None:
    """Launch the tiny training on two CPU ranks; each rank records its result after the group is gone."""
    # admission="unverified": a launcher example, not a certified run (recorded in every rank's context)
    record = LightningFabricLauncher(tiny_ddp.PLAN, accelerator="cpu", admission="unverified").launch(tiny_ddp.train)
    record["process_group_destroyed"] = not dist.is_initialized()
    pathlib.Path(out_dir, f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1])
