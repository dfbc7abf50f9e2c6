"""Gradient helpers that understand DTensor shards: local squared norms weighted by replication, scaling."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor, Replicate

from .layouts import shard_count


@torch.no_grad()  # DTensor.to_local() outside autograd: a quarter of the cost per parameter
def local_grads(params: list[torch.nn.Parameter]) -> list[tuple[torch.Tensor, int]]:
    """(this rank's local gradient tensor, number of distinct shards of the parameter) for every grad.

    Partial placements (a reduction not yet done) are redistributed to Replicate first so a norm
    never squares a partial sum.
    """
    out = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                g = g.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in g.placements])
            out.append((g.to_local(), shard_count(g)))
        else:
            out.append((g, 1))
    return out


def weighted_square_sum(grads: list[tuple[torch.Tensor, int]], world_size: int) -> torch.Tensor:
    """Sum over this rank's grads of ||g||^2 / copies, in float64: summed over the world it is the
    squared global norm, since each distinct shard lives on ``world_size / shards`` ranks."""
    total = torch.zeros((), dtype=torch.float64)
    groups: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = defaultdict(list)
    for g, shards in grads:
        if g.numel():  # grouped so each stack of norms holds one dtype on one device
            groups[world_size // shards, g.dtype, g.device].append(g)
    for (copies, _, _), tensors in groups.items():
        norms = torch.stack(torch._foreach_norm(tensors, 2.0)).detach()  # one stack and one copy, not one per tensor
        total = total + norms.to(device="cpu", dtype=torch.float64).square().sum() / copies
    return total


def scale_grads(params: list[torch.nn.Parameter], factor: float) -> None:
    """Multiply every gradient in place by ``factor`` (through the local shard of a DTensor gradient)."""
    with torch.no_grad():  # to_local() then hands back the DTensor's own local storage
        tensors = []
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                if g.numel():
                    tensors.append(g)
        if tensors:
            torch._foreach_mul_(tensors, factor)
