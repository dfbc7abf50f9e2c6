"""Rank bodies for test_options_world.py: a 2-rank gloo world (DDP) for what the options promise across ranks.

A DDP run with every warning an error, the training ledger (a path on every rank; a Ledger on a rank
other than 0), and a fault injector with the audit off. Results are plain data checked in the parent.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

from mixle_parallel.contracts import ParallelPlan, to_dict
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, digest
from tests.torch._models import global_batches, make_model

DDP = ParallelPlan(dp_replicate=2)
STEPS = 3


def _session(**kwargs: Any) -> Any:
    kwargs.setdefault("admission", "unverified")  # a 2-rank test mesh without a certificate: recorded
    return get_training_backend("torch_native").prepare(make_model(), plan=DDP, optimizer="SGD", lr=0.1, **kwargs)


def _train(session: Any, steps: int = STEPS) -> dict[str, Any]:
    me = dist.get_rank()
    receipts = [to_dict(session.train_batch(*b[me]))["data"] for b in global_batches(steps, [4, 4], seed=31)]
    params = digest({n: p.detach() for n, p in session.module.named_parameters()})
    session.close()
    return {"receipts": receipts, "params": params}


def warnings_as_errors() -> dict[str, Any]:
    """A DDP session from prepare() to close(), defaults on (audit, health), with every warning an error.

    No filter: torch emits nothing outside our calls here (once, our ``apply_ddp`` passed the deprecated
    ``broadcast_buffers`` and every DDP run printed its FutureWarning).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _train(_session())
    return {"steps": len(out["receipts"]), "audited": [r["extra"]["audited"] for r in out["receipts"]]}


def ledger_cases(root: str) -> dict[str, Any]:
    """A ledger path on every rank (rank 0 writes); a Ledger object on rank 1 (refused there, before the session's
    first collective; rank 0 with a Ledger and the others with None is test_sdc_audit's certified run)."""
    path = os.path.join(root, "run", "ledger.jsonl")  # the folder does not exist yet
    out: dict[str, Any] = {"path": path, "trained": _train(_session(ledger=path, audit_rate=1.0))}
    out["object_error"] = None
    if dist.get_rank() == 1:  # refused before any collective, so rank 0 does not take part
        try:
            _session(ledger=Ledger(os.path.join(root, "object-1.jsonl")))
        except ValueError as err:
            out["object_error"] = str(err)
    dist.barrier()
    return out


def fault_injector_without_audit() -> dict[str, Any]:
    """A gradient flip on rank 1 with the audit off strikes (the parameters move away from a clean run's)."""
    flips = FaultInjector([BitFlip("gradient", "blocks.0.up.weight", rank=1, step=1, index=3, bit=20)])
    struck = _train(_session(audit=False, fault_injector=flips))
    clean = _train(_session(audit=False))
    return {"struck": struck["params"], "clean": clean["params"], "applied": len(flips.applied),
            "pending": len(flips.pending)}


def world2() -> dict[str, Any]:
    """Every scenario in one world (the ledger's folder is named by OPTIONS_TEST_ROOT)."""
    torch.manual_seed(0)
    return {"warnings": warnings_as_errors(), "ledger": ledger_cases(os.environ["OPTIONS_TEST_ROOT"]),
            "faults": fault_injector_without_audit()}
