"""Rank body of the megatron in-situ test: two ``prepare`` calls with no certificate, in one launched gloo world."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from tests.megatron._scenarios import HID, mlp, mse


def in_situ_body(rank: int, world: int, home: str) -> dict[str, Any]:
    """prepare twice on dp_replicate=2 (the trust store at ``home`` starts empty); the receipts' admission and
    module probe, and what the library logged."""
    warnings.filterwarnings("ignore")
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("mixle_parallel").addHandler(handler)
    os.environ["MIXLE_PARALLEL_HOME"] = home
    os.environ.pop("MIXLE_PARALLEL_CERTIFICATE", None)
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    backend = get_training_backend("megatron")
    found = []
    for run in range(2):
        session = backend.prepare(mlp(), plan=ParallelPlan(dp_replicate=world), loss_fn=mse, activation_shape=(HID,),
                                  optimizer="sgd", lr=0.05)
        generator = torch.Generator().manual_seed(run * world + rank)
        receipt = session.train_batch(torch.randn(2, 4, generator=generator), torch.randn(2, 3, generator=generator))
        found.append({"admission": receipt.extra["admission"], "certificate": receipt.extra["certificate"],
                      "module_probe": receipt.extra.get("module_probe"),
                      "notes": list(session.admission.notes) if hasattr(session, "admission") else []})
        session.close()
    return {"runs": found, "logged": logged}
