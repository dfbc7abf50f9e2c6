"""Elastic data-parallel training under torchrun: lose a node mid-run, restart smaller, reshard, go on.

torch's elastic agent changes the world size only through membership: each agent is one node with a
fixed ``--nproc-per-node``, and ``--nnodes MIN:MAX`` lets a restart proceed with fewer nodes. So two
agents on one machine stand for two nodes of 2 ranks (world 4); one of them fails mid-run, the
survivor restarts its ranks (``--max-restarts``), re-rendezvouses alone (world 2), and every rank
resumes from the last checkpoint: FSDP2 shards and optimizer state resharded by DCP, the step clock
restored, the loader position (samples consumed, world-size free) read back, so no sample is
skipped or trained twice. Node A (hosts the rendezvous store)::

    python -m torch.distributed.run --nnodes 1:2 --nproc-per-node 2 --max-restarts 2 \
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id demo \
        --rdzv-conf is_host=1,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2 \
        examples/elastic/train_elastic.py OUT

Node B: the same with ``is_host=0`` and ``MIXLE_ELASTIC_FAIL_AT_STEP=6`` in its environment: on its
first attempt its local rank 1 takes the node down before step 6 commits (SIGTERM to its agent, as a
scheduler reclaiming the node would, then SIGKILL to itself). Every rank appends one JSON line per
event to OUT/attempt<A>-rank<R>.jsonl; rank 0 writes OUT/final.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import TorchrunLauncher, get_training_backend

STEPS, CHECKPOINT_EVERY, GLOBAL_BATCH = 8, 2, 8
FEATURES, CLASSES, LR, MOMENTUM = 4, 3, 0.1, 0.9
FAIL_ENV = "MIXLE_ELASTIC_FAIL_AT_STEP"


def make_model() -> nn.Module:
    """The same initial weights on every rank and in the reference (seeded)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum: its state must survive the reshard for the result to match the reference."""
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def rows(ids: range | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples with these global ids: each a pure function of its id."""
    xs, ys = [], []
    for i in ids:
        g = torch.Generator().manual_seed(i)
        xs.append(torch.randn(FEATURES, generator=g))
        ys.append(torch.randint(0, CLASSES, (), generator=g))
    return torch.stack(xs), torch.stack(ys)


def reference() -> dict[str, list[Any]]:
    """The whole run in one process without failures: every global batch once, in order."""
    model = make_model()
    opt = make_optimizer(model.parameters())
    for step in range(STEPS):
        x, y = rows(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {name: p.detach().tolist() for name, p in model.named_parameters()}


def _take_node_down() -> None:
    """This node is lost: its agent is told to stop (without closing the rendezvous), this rank dies."""
    os.kill(os.getppid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGKILL)


def _log(out: Path, attempt: int, rank: int, event: dict[str, Any]) -> None:
    with open(out / f"attempt{attempt}-rank{rank}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({**event, "unix_s": time.time()}) + "\n")


def train(out: Path, rank: int, world: int, attempt: int, plan: ParallelPlan) -> None:
    """Resume from the last checkpoint if there is one, then train to STEPS, checkpointing as we go."""
    torch.set_num_threads(1)
    session = get_training_backend("torch_native").prepare(
        make_model(), plan=plan, optimizer=make_optimizer, admission="unverified",
        health={"heartbeat_interval_s": 0.25, "dead_after_s": 5.0, "on_failure": "exit"})
    ck, consumed, saved_world = out / "ck", 0, None
    if (ck / "LATEST").exists():
        loaded = session.load_checkpoint(str(ck), allow_world_size_change=True)
        consumed, saved_world = loaded["loader_state"]["samples_consumed"], loaded["saved_world_size"]
    _log(out, attempt, rank, {"event": "start", "world": world, "step": session.step, "consumed": consumed,
                              "saved_world": saved_world})
    fail_at = int(os.environ.get(FAIL_ENV, "0")) if attempt == 0 else 0
    share = GLOBAL_BATCH // world
    while session.step < STEPS:
        mine = list(range(consumed + rank * share, consumed + (rank + 1) * share))
        if session.step + 1 == fail_at and int(os.environ["LOCAL_RANK"]) == 1:
            _log(out, attempt, rank, {"event": "killed", "step": session.step + 1, "ids": mine})
            _take_node_down()
        receipt = session.train_batch(*rows(mine))
        consumed += GLOBAL_BATCH
        health = receipt.extra["health"]
        _log(out, attempt, rank, {"event": "step", "step": receipt.step, "ids": mine, "loss": receipt.loss,
                                  "global_examples": receipt.global_examples, "skipped": receipt.skipped,
                                  "step_time_s": health["step_time_s"], "restart": health["restart"],
                                  "anomalies": [a["kind"] for a in health["anomalies"]]})
        if receipt.step % CHECKPOINT_EVERY == 0:
            session.save_checkpoint(str(ck), loader_state={"samples_consumed": consumed})
    module = session.module
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().tolist()
              for n, p in module.named_parameters()}  # collective under FSDP2
    if rank == 0:
        (out / "final.json").write_text(json.dumps({"world": world, "attempt": attempt, "params": params}))
    session.close()


def main(out_dir: str) -> None:
    """Bind this rank to a data-parallel plan of the world this attempt got, then train."""
    world = int(os.environ["WORLD_SIZE"])
    plan = ParallelPlan(dp_shard=world)
    with TorchrunLauncher.worker(plan) as context:
        train(Path(out_dir), context.rank, world, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), plan)


if __name__ == "__main__":
    main(sys.argv[1])
