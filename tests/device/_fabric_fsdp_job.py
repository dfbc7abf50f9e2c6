"""Job script for test_fabric_fsdp.py: Fabric's own FSDP (``fabric.setup``) on 2 GPUs via LightningFabricLauncher.

Run by the test as ``python tests/device/_fabric_fsdp_job.py OUT_DIR`` with examples/launchers on
PYTHONPATH (for ``tiny_ddp``); Fabric re-runs it for rank 1.
Each rank writes OUT_DIR/rank<R>.json with its attestation and its gathered final parameters.
"""

from __future__ import annotations

import json
import pathlib
import sys

import tiny_ddp  # examples/launchers/tiny_ddp.py, on PYTHONPATH
import torch
import torch.distributed as dist
import torch.nn.functional as F

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import LightningFabricLauncher

PLAN = ParallelPlan(dp_shard=2)


def train(context):  # type: ignore[no-untyped-def]
    """Fabric FSDP: setup_module then setup_optimizers; 3 steps on this rank's share; full parameters back."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.backends.cuda.matmul.allow_tf32 = False
    fabric = context.handle
    model = fabric.setup_module(tiny_ddp.make_model())
    optimizer = fabric.setup_optimizers(tiny_ddp.make_optimizer(model.parameters()))
    for step in tiny_ddp.global_batches(PLAN.data_parallel_size):
        x, y = (t.to(fabric.device) for t in step[context.data_parallel_index])
        optimizer.zero_grad()
        fabric.backward(F.cross_entropy(model(x), y))  # local mean; FSDP averages over the 2 equal shares
        optimizer.step()
    with FullyShardedDataParallel.summon_full_params(model._forward_module):
        params = {n.replace("_fsdp_wrapped_module.", ""): p.detach().cpu().tolist()
                  for n, p in model._forward_module.named_parameters()}
    return {
        "rank": context.rank,
        "coordinate": context.coordinate.as_dict(),
        "strategy": type(fabric.strategy).__name__,
        "process_group_rank": dist.get_rank(),
        "params": params,
    }


if __name__ == "__main__":
    record = LightningFabricLauncher(PLAN, accelerator="gpu", admission="unverified").launch(train)
    record["process_group_destroyed"] = not dist.is_initialized()
    pathlib.Path(sys.argv[1], f"rank{record['rank']}.json").write_text(json.dumps(record))
