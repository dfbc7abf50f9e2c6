"""Rank bodies of the health tests (2 gloo ranks, DDP): a loss spike, a slow rank, a hung and a frozen rank."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.executors.torch.losses import lm_token_loss
from tests.torch._models import SEQ, VOCAB, make_model

SPIKE_STEP, STOP_STEP = 8, 3
ONE_SLOW_STEP, SLOW_STEPS = 4, (10, 11, 12)
"""Rank 1 is slow on one step alone (noise, no straggler) and on three in a row (a straggler)."""
SLOW_S = 0.4


def _session(rank: int, loss_fn: Any, **health: Any) -> Any:
    return get_training_backend("torch_native").prepare(
        make_model(), plan=ParallelPlan(dp_replicate=2), optimizer="SGD", lr=0.01, admission="unverified",
        audit=False, loss_fn=loss_fn, health={"window": 6, "min_periods": 4, "straggler_min_s": 0.1, **health})


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, VOCAB, (4, SEQ), generator=g)
    return x, x.roll(-1, dims=1)


def spike_and_straggler(rank: int, world_size: int) -> list[dict[str, Any]]:
    """14 steps; step SPIKE_STEP's loss value is 30x (its gradient is not); rank 1 is slow at ONE_SLOW_STEP and
    SLOW_STEPS."""
    step = {"n": 0}

    def loss_fn(module: Any, x: Any, y: Any) -> Any:
        loss_sum, count = lm_token_loss(module, x, y)
        if step["n"] + 1 == SPIKE_STEP:
            loss_sum = loss_sum + 29 * loss_sum.detach()  # the value spikes, the gradient does not
        if step["n"] + 1 in (ONE_SLOW_STEP, *SLOW_STEPS) and rank == 1:
            time.sleep(SLOW_S)
        return loss_sum, count

    session = _session(rank, loss_fn)
    x, y = _batch(rank)
    out = []
    for _ in range(14):
        receipt = session.train_batch(x, y)
        step["n"] = receipt.step
        h = receipt.extra["health"]
        out.append({"step": receipt.step, "straggler": h["straggler"], "rank_step_s": list(h["rank_step_s"]),
                    "kinds": [a["kind"] for a in h["anomalies"]], "tokens_per_s": h["tokens_per_s"],
                    "mfu": h["mfu"], "global_tokens": receipt.global_tokens})
    session.close()
    return out


def stop(rank: int, world_size: int, how: str, incident_dir: str) -> None:
    """Rank 1 stops inside step STOP_STEP: 'hung' sleeps (its heartbeat goes on), 'frozen' SIGSTOPs itself
    (a helper SIGKILLs it 20 s later so no stopped process outlives the test)."""
    def loss_fn(module: Any, x: Any, y: Any) -> Any:
        if rank == 1 and session.step + 1 == STOP_STEP:
            if how == "hung":
                time.sleep(120)
            else:
                subprocess.Popen(["sh", "-c", f"sleep 20; kill -9 {os.getpid()}"], start_new_session=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        return lm_token_loss(module, x, y)

    session = _session(rank, loss_fn, heartbeat_interval_s=0.2, dead_after_s=3.0, hung_after_s=3.0,
                       incident_dir=incident_dir)
    x, y = _batch(rank)
    for _ in range(6):
        session.train_batch(x, y)
    session.close()
