"""Tiny DDP training with a torch_native session under torchrun, every rank bound to its plan coordinate.

Run:  torchrun --standalone --nproc-per-node 2 examples/launchers/torchrun_ddp.py OUT_DIR
(or ``TorchrunLauncher(tiny_ddp.PLAN).run("examples/launchers/torchrun_ddp.py", OUT_DIR)``).
Each rank writes OUT_DIR/rank<R>.json with its attestation and final parameters.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tiny_ddp
import torch.distributed as dist

from mixle_parallel.executors import TorchrunLauncher


def main(out_dir: str) -> None:
    """Bind this rank (attestation from RANK/WORLD_SIZE + Resources.from_torchrun), train, write the record."""
    with TorchrunLauncher.worker(tiny_ddp.PLAN) as context:
        record = tiny_ddp.train(context)
        record["resources"] = [d.name for d in context.handle.devices]
    record["process_group_destroyed"] = not dist.is_initialized()
    pathlib.Path(out_dir, f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1])
