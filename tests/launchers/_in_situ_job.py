"""A plain torchrun training script for the in-situ certification tests: ``prepare`` with no certificate anywhere.

``python -m torch.distributed.run --nproc-per-node 2 _in_situ_job.py OUT MODE``; MODE is ``ddp``, ``fsdp`` or
``skewed`` (a module whose backward differs per rank: the probe of the user's module must refuse it). Each rank
writes ``OUT/rank<r>.json``: the receipt's admission and certificate, or the refusal's text.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.executors import get_training_backend


class _RankSkewedGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by 1 + rank (a fault only the multi-rank path shows)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1 + (dist.get_rank() if dist.is_initialized() else 0))


class Skewed(nn.Module):
    """Linear -> rank-skewed gradient -> tanh -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(_RankSkewedGradient.apply(self.first(x))))


def _loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ((module(x) - y) ** 2).sum(), torch.tensor(x.shape[0])


def main(out: str, mode: str) -> None:
    plan = ParallelPlan(dp_shard=2) if mode == "fsdp" else ParallelPlan(dp_replicate=2)
    torch.manual_seed(0)
    model = Skewed() if mode == "skewed" else nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    rank = int(os.environ["RANK"])
    try:
        session = get_training_backend("torch_native").prepare(model, plan=plan, loss_fn=_loss, optimizer="SGD",
                                                               lr=0.1)
    except NotAdmittedError as exc:
        record: dict[str, Any] = {"refused": str(exc)}
    else:
        generator = torch.Generator().manual_seed(rank)
        receipt = session.train_batch(torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator))
        record = {"admission": receipt.extra["admission"], "certificate": receipt.extra["certificate"]}
        session.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
