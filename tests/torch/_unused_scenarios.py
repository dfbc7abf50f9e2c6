"""DDP with parameters that get no gradient, on a real 2-rank gloo world (run by test_unused_parameters.py).

One world walks the three cases on a fresh trust store, in order: the in-situ probe names the parameters
at ``prepare``; ``find_unused_parameters=True`` certifies in situ and trains; then, admitted by the
certificate that run stored (no probe), the first step names them, and the ``close`` in the script's
``finally`` does not raise over that error.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.torch.backend import TorchDistributedBackend


class WithUnused(nn.Module):
    """Two layers, one never used by ``forward``: its weight and bias get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ((module(x) - y) ** 2).sum(), torch.tensor(x.shape[0])


def _prepare(**options: Any) -> Any:
    torch.manual_seed(0)
    return TorchDistributedBackend().prepare(WithUnused(), plan=ParallelPlan(dp_replicate=2), loss_fn=_loss,
                                             optimizer="SGD", lr=0.1, health=False, **options)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    return torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "first_line": str(exc).splitlines()[0],
            "traceback": "".join(traceback.format_exception(exc)), "names": list(getattr(exc, "names", ()))}


def unused_parameters() -> dict[str, Any]:
    """Each case's outcome on this rank."""
    out: dict[str, Any] = {}
    try:  # 1. no certificate anywhere: certified in situ, whose probe finds the parameters
        _prepare()
        out["at_prepare"] = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["at_prepare"] = _failure(exc)

    session = _prepare(find_unused_parameters=True)  # 2. certifies in situ (the probe passes) and trains
    before = {n: p.detach().clone() for n, p in session.module.module.named_parameters()}
    receipts = [session.train_batch(*_batch()) for _ in range(2)]
    after = {n: p.detach().clone() for n, p in session.module.module.named_parameters()}
    session.close()
    out["with_option"] = {"admission": receipts[0].extra["admission"], "steps": [r.step for r in receipts],
                          "audited": receipts[0].extra.get("audited"),
                          "changed": sorted(n for n in before if not torch.equal(before[n], after[n]))}

    session = _prepare()  # 3. admitted by the stored certificate: no probe, so the first step says it
    out["admission_without_option"] = session.admission.mode
    try:
        try:
            session.train_batch(*_batch())
        finally:
            session.close()  # a script's cleanup while the step's error is in flight
        out["at_step"] = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["at_step"] = _failure(exc)
    return out
