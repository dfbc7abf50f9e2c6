"""The parallelisms, one small function each, applied in torchtitan's order: TP, CP, then FSDP2/HSDP or DDP."""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from ...contracts import ParallelAxis
from .device_mesh import require_axis_mesh
from .dp_mode import DataParallelMode

BUFFER_SYNC_OPTION = ("forward_sync_buffers" if "forward_sync_buffers" in
                      inspect.signature(DistributedDataParallel.__init__).parameters else "broadcast_buffers")
"""DDP's per-forward buffer sync flag: ``forward_sync_buffers`` where torch has it (its ``broadcast_buffers``
is deprecated there, with a FutureWarning), ``broadcast_buffers`` before. Either way buffers are synced
at construction; ``False`` only skips the per-forward broadcast of a module without buffers."""

# tp_plan style names a user may write instead of a ParallelStyle object
_STYLE_NAMES = ("colwise", "colwise_replicate", "rowwise", "sequence")


def make_style(name: str) -> ParallelStyle:
    """A fresh ParallelStyle for one of the names 'colwise', 'colwise_replicate', 'rowwise', 'sequence'."""
    if name == "colwise":
        return ColwiseParallel()
    if name == "colwise_replicate":  # e.g. an LM head whose logits the loss needs whole
        return ColwiseParallel(output_layouts=Replicate())
    if name == "rowwise":
        return RowwiseParallel()
    if name == "sequence":
        return SequenceParallel()
    raise ValueError(f"unknown tensor-parallel style {name!r}; use one of {_STYLE_NAMES} or a ParallelStyle object")


def _sharded_sizes(module: nn.Module, style: str) -> list[tuple[str, int]]:
    """(what, size) of every dimension ``style`` shards on ``module``; raises for unsupported modules."""
    if style == "sequence":
        return []  # shards activations on the sequence dimension; parameters stay replicated
    col = style.startswith("colwise")
    if isinstance(module, nn.Linear):
        return [("out_features", module.out_features)] if col else [("in_features", module.in_features)]
    if isinstance(module, nn.Embedding):
        return [("embedding_dim", module.embedding_dim)] if col else [("num_embeddings", module.num_embeddings)]
    raise ValueError(
        f"tensor-parallel style {style!r} supports nn.Linear and nn.Embedding, not {type(module).__name__}; "
        "pass a ParallelStyle object for other modules"
    )


def resolve_tp_plan(module: nn.Module, tp_plan: Mapping[str, Any] | None, tp: int) -> dict[str, ParallelStyle]:
    """Expand module-path patterns (fnmatch) to concrete paths and check that ``tp`` divides every sharded dim.

    Raises before any collective: an empty plan with tp > 1, a pattern that matches no module, a
    style on an unsupported module, or a dimension ``tp`` does not divide (naming the module, the
    dimension and its size).
    """
    if tp == 1:
        return {}
    if not tp_plan:
        raise ValueError(
            f"plan has tp={tp} but no tp_plan was given; pass tp_plan={{'layers.*.proj_in': 'colwise', "
            "'layers.*.proj_out': 'rowwise', ...}} mapping module-path patterns to styles"
        )
    names = [n for n, _ in module.named_modules() if n]
    expanded: dict[str, ParallelStyle] = {}
    problems: list[str] = []
    for pattern, style in tp_plan.items():
        matches = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matches:
            problems.append(f"tp_plan pattern {pattern!r} matches no submodule (some names: {names[:8]})")
            continue
        for path in matches:
            if isinstance(style, ParallelStyle):
                expanded[path] = style  # a user style checks its own shapes
                continue
            if not isinstance(style, str):
                problems.append(f"tp_plan[{pattern!r}] must be a style name {_STYLE_NAMES} or a ParallelStyle")
                break
            sub = module.get_submodule(path)
            try:
                sizes = _sharded_sizes(sub, style)
                make_style(style)
            except ValueError as err:
                problems.append(f"{path}: {err}")
                continue
            for what, size in sizes:
                if size % tp:
                    problems.append(
                        f"{path} ({type(sub).__name__}) {what}={size} is not divisible by tp={tp}; "
                        f"choose tp from the divisors of {size} or change the layer"
                    )
            expanded[path] = make_style(style)
    if problems:
        raise ValueError("tensor-parallel plan cannot run: " + "; ".join(problems))
    return expanded


def apply_tp(module: nn.Module, tp_mesh: DeviceMesh, styles: dict[str, ParallelStyle]) -> None:
    """Shard the planned submodules over the tp mesh with ``parallelize_module`` (DTensor parameters)."""
    parallelize_module(module, tp_mesh, styles)


def fsdp_blocks(module: nn.Module) -> list[nn.Module]:
    """The blocks to shard one by one: the items of the first ModuleList found (breadth-first), else the
    parameter-holding children of an nn.Sequential root; the root itself is always sharded last."""
    queue: list[nn.Module] = [module]
    while queue:
        current = queue.pop(0)
        for child in current.children():
            if isinstance(child, nn.ModuleList):
                return [b for b in child if any(True for _ in b.parameters())]
            queue.append(child)
    if isinstance(module, nn.Sequential):
        return [c for c in module if any(True for _ in c.parameters())]
    return []


def apply_fsdp(module: nn.Module, dp_mesh: DeviceMesh) -> None:
    """FSDP2 ``fully_shard`` per block, then the root; a 2-D ``dp_mesh`` (replicate, shard) makes it HSDP."""
    for block in fsdp_blocks(module):
        fully_shard(block, mesh=dp_mesh)
    fully_shard(module, mesh=dp_mesh)


def fsdp_mesh(mode: DataParallelMode, dp_mesh: DeviceMesh) -> DeviceMesh:
    """The mesh ``fully_shard`` gets: FSDP over dp_shard and cp together shards over both as one flattened
    dimension (torchtitan's ``dp_shard_cp``); given the 2-D mesh, FSDP2 would replicate over dp_shard (HSDP)."""
    if mode is DataParallelMode.FSDP and dp_mesh.ndim > 1:
        return dp_mesh._flatten("_".join(dp_mesh.mesh_dim_names or ()))
    return dp_mesh


def apply_ddp(module: nn.Module, dp_mesh: DeviceMesh, device: torch.device,
              find_unused_parameters: bool = False) -> DistributedDataParallel:
    """DistributedDataParallel over the 1-D dp_replicate mesh (the plan has no sharded or model axis).

    The gradients are views of DDP's buckets (``gradient_as_bucket_view``): no second gradient-sized
    buffer, and no copy back out of the buckets after the all-reduce, which pays for the commit's norm.
    """
    device_ids = [device.index] if device.type == "cuda" and device.index is not None else None
    has_buffers = any(True for _ in module.buffers())  # nothing to broadcast otherwise: skip the per-forward call
    buffer_sync: dict[str, Any] = {BUFFER_SYNC_OPTION: has_buffers}
    return DistributedDataParallel(module, device_ids=device_ids, device_mesh=dp_mesh, gradient_as_bucket_view=True,
                                   find_unused_parameters=find_unused_parameters, **buffer_sync)


def parallelize(
    module: nn.Module,
    *,
    mode: DataParallelMode,
    mesh: DeviceMesh | None,
    tp_styles: dict[str, ParallelStyle],
    device: torch.device,
    find_unused_parameters: bool = False,
) -> nn.Module:
    """Apply the parallelisms in torchtitan's fixed order: TP, then FSDP2/HSDP or DDP; returns the module to train.

    Context parallelism transforms no module (the session enters ``context_parallel`` per
    micro-batch); DDP returns its wrapper (``find_unused_parameters`` is DDP's), every other step
    transforms ``module`` in place.
    """
    module = module.to(device)
    if tp_styles:
        apply_tp(module, require_axis_mesh(mesh, ParallelAxis.TP), tp_styles)
    if mode.uses_fsdp:
        apply_fsdp(module, fsdp_mesh(mode, require_axis_mesh(mesh, *mode.mesh_axes())))
    elif mode.uses_ddp:
        module = apply_ddp(module, require_axis_mesh(mesh, *mode.mesh_axes()), device, find_unused_parameters)
    return module
