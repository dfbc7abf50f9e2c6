"""ParameterLayout records read from the real DTensor placements of a transformed module."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ...contracts import ParallelPlan, ParameterLayout, StateLayout

_WRAPPER_PARTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 and DTensor TP keep the module itself)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def pre_wrap_fqn(name: str) -> str:
    """A parameter name without the path parts wrappers insert (torch.compile, activation checkpointing)."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def is_shard(placement: Any) -> bool:
    """True for Shard(d) and for the strided shards FSDP2 uses on top of tensor parallelism."""
    return bool(placement.is_shard()) or isinstance(getattr(placement, "dim", None), int)


def local_part(t: Any) -> Any:
    """This rank's part of ``t``: a DTensor's local tensor, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def placement_text(placement: Any) -> str:
    """'Shard(d)', 'Replicate()' or 'Partial(op)' for a DTensor placement (strided shards are shards of d)."""
    if is_shard(placement):
        return f"Shard({placement.dim})"
    if placement.is_replicate():
        return "Replicate()"
    if placement.is_partial():
        op = getattr(placement, "reduce_op", "sum")
        return f"Partial({op})" if op in ("sum", "avg", "max", "min") else "Partial()"
    raise ValueError(f"unknown DTensor placement {placement!r}; expected Shard, Replicate or Partial")


def layout_of(name: str, param: torch.Tensor, plan: ParallelPlan, shared_group: str | None) -> ParameterLayout:
    """The layout of one parameter: its DTensor placements on every active mesh axis (Replicate() elsewhere)."""
    active = [a.value for a in plan.active_axes if a.value in ("pp", "dp_replicate", "dp_shard", "cp", "tp")]
    placed: dict[str, str] = {}
    shape = tuple(int(s) for s in param.shape)
    if isinstance(param, DTensor):
        names = param.device_mesh.mesh_dim_names or ()
        for i, (dim_name, placement) in enumerate(zip(names, param.placements)):
            if param.device_mesh.size(i) > 1:
                placed[dim_name] = placement_text(placement)
    pairs = tuple((axis, placed.get(axis, "Replicate()")) for axis in active)
    sharded = any(p.startswith("Shard") for _, p in pairs)
    return ParameterLayout(
        logical_id=name,
        global_shape=shape,
        placements=pairs,
        shared_group=shared_group,
        optimizer_state=StateLayout.SHARDED if sharded else StateLayout.REPLICATED,
    )


def describe_parameter_layouts(module: nn.Module, plan: ParallelPlan) -> tuple[ParameterLayout, ...]:
    """Layouts of every parameter of ``module`` (transformed or not), keyed by the pre-wrap FQN.

    Parameters tied to one tensor share a ``shared_group`` named after the first FQN that holds it.
    """
    inner = unwrap(module)
    first_name: dict[int, str] = {}
    users: dict[int, int] = {}
    named = list(inner.named_parameters(remove_duplicate=False))
    for name, param in named:
        first_name.setdefault(id(param), pre_wrap_fqn(name))
        users[id(param)] = users.get(id(param), 0) + 1
    layouts = []
    for name, param in named:
        group = first_name[id(param)] if users[id(param)] > 1 else None
        layouts.append(layout_of(pre_wrap_fqn(name), param, plan, group))
    return tuple(layouts)


def shard_count(param: torch.Tensor) -> int:
    """How many distinct shards a (synchronized) tensor has across the world: the product of its Shard dims."""
    if not isinstance(param, DTensor):
        return 1
    mesh = param.device_mesh
    return math.prod(mesh.size(i) for i, p in enumerate(param.placements) if is_shard(p))
