"""A real multi-process test base: spawn N gloo ranks once, run a scenario function on each, collect results."""

from __future__ import annotations

import os
import tempfile
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, store_path: str, module: str, function: str, out_dir: str,
           backend: str = "gloo") -> None:
    import importlib

    torch.set_num_threads(1)
    dist.init_process_group(
        backend, store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size,
        timeout=timedelta(minutes=5),
    )
    try:
        result = getattr(importlib.import_module(module), function)()
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(world_size: int, module: str, function: str, backend: str = "gloo") -> list[Any]:
    """Run ``module.function()`` on ``world_size`` gloo ranks (FileStore rendezvous); return each rank's result."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        try:
            mp.start_processes(
                _entry, args=(world_size, store, module, function, tmp, backend), nprocs=world_size, start_method="spawn"
            )
        except Exception as err:
            errors = [open(os.path.join(tmp, f)).read() for f in sorted(os.listdir(tmp)) if f.endswith(".err")]
            raise AssertionError("a rank failed:\n" + ("\n".join(errors) or str(err))) from None
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
