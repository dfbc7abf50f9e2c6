"""Rank bodies for test_sdc_reference_nograd.py: FSDP2 groups where some parameter gets no gradient.

The model has a layer the forward never calls and a frozen layer (``requires_grad=False``), both inside
the root FSDP2 group with parameters that do get gradients, so that group's reduce-scatter input leaves
them out. The audit must still recompute the window on its plain copy (a no-grad parameter simply has no
gradient on either side) instead of falling back to the executor's own replay.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mixle_parallel.contracts import ParallelPlan, to_dict
from mixle_parallel.executors import get_training_backend
from tests.torch._audit_scenarios import cheating, params_digest
from tests.torch._models import VOCAB, global_batches

FSDP = ParallelPlan(dp_shard=2)
STEPS = 3


class PartlyTrained(nn.Module):
    """Embedding -> body -> frozen -> head; ``unused`` is never called (it never gets a gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 6)
        self.body = nn.Linear(6, 10)
        self.frozen = nn.Linear(10, 10)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(10, 4)
        self.head = nn.Linear(10, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(torch.tanh(self.body(self.embed(tokens)))))


def _session(**kwargs: Any) -> Any:
    torch.manual_seed(7)
    return get_training_backend("torch_native").prepare(
        PartlyTrained(), plan=FSDP, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        admission="unverified", **kwargs)


def _drive(s: Any, batches: list) -> dict[str, Any]:
    me, receipts, raised = dist.get_rank(), [], None
    try:
        for per_rank in batches:
            receipts.append(to_dict(s.train_batch(*per_rank[me]))["data"])
    except Exception as exc:  # noqa: BLE001 - the parent checks which error and its records
        raised = {"type": type(exc).__name__, "message": str(exc),
                  "bad": sorted({(r.replay, r.rank, r.cause, r.unit) for r in getattr(exc, "records", ())
                                 if not r.matched})}
    out = {"raised": raised, "params": params_digest(s), "step": s.step,
           "records": [to_dict(r)["data"] for r in s.audit_records]}
    s.close()
    return out


def world2() -> dict[str, Any]:
    """The unaudited run, the honest audited run (replay "both": every rank's reference record shows) and an
    executor that cheats outside the harness, on the same batches."""
    batches = global_batches(STEPS, [4, 4], seed=31)
    return {
        "plain": _drive(_session(audit=False), batches),
        "honest": _drive(_session(audit_rate=1.0, audit_policy="raise", audit_replay="both"), batches),
        "cheat": _drive(cheating(_session(audit_rate=1.0, audit_policy="raise")), batches),
    }
