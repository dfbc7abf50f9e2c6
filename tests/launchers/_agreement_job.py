"""A torchrun script whose ranks may see different trust stores and train different modules (issue 34 items 5, 6).

``python -m torch.distributed.run --nproc-per-node 2 _agreement_job.py OUT MODEL HOME0 HOME1``: rank r uses HOMEr
as its trust store (``MIXLE_PARALLEL_HOME``), then prepares a DDP run of MODEL (``plain``; ``skewed``: its backward
differs per rank; ``normed``: a LayerNorm first layer; ``normed_skewed``: a LayerNorm first layer and a backward
that differs per rank behind it; ``rms_normed``, ``batch_normed``, ``conv1d``, ``conv2d``: honest modules with
those first layers) with no certificate given and trains one step. Each rank writes ``OUT/rank<r>.json``: the
receipt's admission, certificate and module probe, or the refusal's text.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch import nn

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.executors import get_training_backend
from tests.launchers._in_situ_job import Skewed, _RankSkewedGradient


class NormedSkewed(nn.Module):
    """LayerNorm -> rank-skewed gradient -> linear -> tanh -> linear (issue 34's attack behind a LayerNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.first, self.second = nn.LayerNorm(6), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(_RankSkewedGradient.apply(self.norm(x)))))


class _Flat(nn.Module):
    """A convolution's output made rows of 3 features, as the job's loss expects."""

    def __init__(self, conv: nn.Module, features: int) -> None:
        super().__init__()
        self.conv, self.head = conv, nn.Linear(features, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.conv(x)).mean(dim=tuple(range(2, x.dim()))))


def _loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ((module(x) - y) ** 2).sum(), torch.tensor(x.shape[0])


def _model(kind: str) -> nn.Module:
    if kind == "skewed":
        return Skewed()
    if kind == "normed":
        return nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if kind == "normed_skewed":
        return NormedSkewed()
    if kind == "rms_normed":
        return nn.Sequential(nn.RMSNorm(6), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if kind == "batch_normed":
        return nn.Sequential(nn.BatchNorm1d(6), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if kind == "conv1d":
        return _Flat(nn.Conv1d(6, 4, kernel_size=3), 4)
    if kind == "conv2d":
        return _Flat(nn.Conv2d(6, 4, kernel_size=(3, 2), dilation=(1, 2)), 4)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def main(out: str, kind: str, *homes: str) -> None:
    rank = int(os.environ["RANK"])
    os.environ["MIXLE_PARALLEL_HOME"] = homes[rank]
    torch.manual_seed(0)
    model = _model(kind)
    try:
        session = get_training_backend("torch_native").prepare(model, plan=ParallelPlan(dp_replicate=2),
                                                               loss_fn=_loss, optimizer="SGD", lr=0.1)
    except NotAdmittedError as exc:
        record: dict[str, Any] = {"refused": str(exc)}
    else:
        generator = torch.Generator().manual_seed(rank)
        spatial = {"conv1d": (10,), "conv2d": (10, 10)}.get(kind, ())
        receipt = session.train_batch(torch.randn(4, 6, *spatial, generator=generator),
                                      torch.randn(4, 3, generator=generator))
        record = {"admission": receipt.extra["admission"], "certificate": receipt.extra["certificate"],
                  "module_probe": receipt.extra.get("module_probe")}
        session.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
