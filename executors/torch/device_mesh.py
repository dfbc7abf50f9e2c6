"""Process group and DeviceMesh for a ParallelPlan: torch version gate, torchrun init, rank layout check."""

from __future__ import annotations

import atexit
import gc
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ...contracts import ParallelAxis, ParallelPlan, attest_worker_coordinate, comm_backend_for

MIN_TORCH = (2, 6)
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_EXIT_HOOK: list[bool] = []  # set once the at-exit release is registered


def destroy_default_group() -> bool:
    """Destroy the default process group, if one exists, once what the run left in reference cycles is collected;
    True when one was destroyed.

    Why the collection: the C++ objects such garbage holds (a DDP module's reducer, gloo work) keep the group's
    threads alive; freed in interpreter teardown, after the group, they abort the process ("terminate called
    without an active exception": a refused in-situ certification's workload in about 4 runs of 10, a Fabric
    rank in 2 of 7, a torchrun rank of docs/training.md's token handle once in CI)."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    gc.collect()
    dist.destroy_process_group()
    return True


def torch_version_tuple(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.13.0+cpu'."""
    text = (version or torch.__version__).split("+", 1)[0]
    parts = text.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        raise RuntimeError(f"cannot read the torch version {text!r}; install torch>=2.6") from None


def require_torch(version: str | None = None) -> None:
    """Raise unless torch >= 2.6 (the FSDP2 ``fully_shard`` public API) is installed."""
    installed = version or torch.__version__
    if torch_version_tuple(installed) < MIN_TORCH:
        raise RuntimeError(
            f"torch_native needs torch>=2.6 (the public FSDP2 fully_shard API); torch {installed} is "
            "installed. Upgrade with `pip install 'mixle-parallel[torch]'`"
        )


def resolve_device(device: Any = None) -> torch.device:
    """The device this rank computes on: ``device`` if given, else cuda:LOCAL_RANK when CUDA exists, else cpu."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def ensure_process_group(plan: ParallelPlan, device: torch.device) -> bool:
    """Use the existing default process group, or create one from the torchrun environment.

    Returns True when this call created the group. As in mixle 0.8.2 the group outlives the session
    (``close`` leaves it, so a script may run collectives after it and destroy the group itself);
    one the script has not destroyed is destroyed at interpreter exit.
    A single-rank plan without a process group and without torchrun variables runs without one.
    """
    if dist.is_available() and dist.is_initialized():
        plan.validate_world_size(dist.get_world_size())
        return False
    missing = [k for k in _TORCHRUN_ENV if k not in os.environ]
    if plan.world_size == 1 and missing:
        return False
    if missing:
        raise RuntimeError(
            f"plan {plan.describe()} needs {plan.world_size} processes, but no process group exists and the "
            f"torchrun variables {missing} are not set; launch with `torchrun --nproc-per-node "
            f"{plan.world_size} script.py` or call torch.distributed.init_process_group first"
        )
    plan.validate_world_size(int(os.environ["WORLD_SIZE"]))
    comm = comm_backend_for(device)  # CPU tensors (the session's small control ones) always go through gloo
    backend = "gloo" if comm == "gloo" else f"cpu:gloo,{device.type}:{comm}"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=10))
    if not _EXIT_HOOK:
        atexit.register(destroy_default_group)  # a group the script did not destroy itself
        _EXIT_HOOK.append(True)
    return True


def build_mesh(plan: ParallelPlan, device: torch.device, *, unit_shard_dim: bool = False) -> DeviceMesh | None:
    """The DeviceMesh named and shaped by ``plan.mesh``; None for a one-rank plan.

    ``unit_shard_dim`` inserts a size-1 ``dp_shard`` dimension after ``dp_replicate`` (HSDP with a
    shard group of one is FSDP2's no-shard data parallelism, used for dp_replicate x tp); it does
    not change the rank layout. The layout is checked against ``attest_worker_coordinate`` so the
    mesh and the plan's rank math cannot disagree.
    """
    if plan.world_size == 1:
        return None
    dim_names, dim_sizes = list(plan.mesh.names), list(plan.mesh.shape)
    if unit_shard_dim and "dp_shard" not in dim_names:
        at = dim_names.index("dp_replicate") + 1
        dim_names.insert(at, "dp_shard")
        dim_sizes.insert(at, 1)
    names, shape = tuple(dim_names), tuple(dim_sizes)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    rank = dist.get_rank()
    attested = attest_worker_coordinate(plan, actual_world_size=dist.get_world_size(), rank=rank).coordinate
    observed = mesh.get_coordinate()
    if observed is None:  # pragma: no cover - every rank of the world is in the mesh
        raise RuntimeError(f"rank {rank} is not part of the DeviceMesh {mesh}")
    for name, index in zip(names, observed):
        if attested[name] != index:
            raise RuntimeError(
                f"DeviceMesh places rank {rank} at {name}={index} but the plan attests {name}="
                f"{attested[name]}; the mesh layout must follow ParallelPlan.mesh"
            )
    return mesh


def axis_mesh(mesh: DeviceMesh | None, *axes: ParallelAxis) -> DeviceMesh | None:
    """The sub-mesh over the active ones among ``axes`` (None when none of them is active)."""
    if mesh is None:
        return None
    names = tuple(a.value for a in axes if a.value in (mesh.mesh_dim_names or ()))
    if not names:
        return None
    if names == tuple(mesh.mesh_dim_names or ()):
        return mesh
    return mesh[names if len(names) > 1 else names[0]]


def require_axis_mesh(mesh: DeviceMesh | None, *axes: ParallelAxis) -> DeviceMesh:
    """``axis_mesh(mesh, *axes)`` where the plan makes one of ``axes`` active (size > 1): the mesh then has
    that dimension (``ParallelPlan.mesh`` names every active axis), so the sub-mesh exists."""
    sub = axis_mesh(mesh, *axes)
    if sub is None:
        raise RuntimeError(f"no active mesh dimension among {[a.value for a in axes]} in {mesh}")
    return sub


def axis_size(mesh: DeviceMesh | None, axis: ParallelAxis) -> int:
    """Size of one mesh dimension (1 when the axis is not active)."""
    dim_names = () if mesh is None else (mesh.mesh_dim_names or ())
    if mesh is None or axis.value not in dim_names:
        return 1
    return int(mesh.size(dim_names.index(axis.value)))
