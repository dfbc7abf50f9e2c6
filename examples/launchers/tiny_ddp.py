"""The one tiny DDP training every launcher example runs: a torch_native session on a fixed model and data.

Every launcher (torchrun, Lightning Fabric, Ray Train) calls :func:`train` on each of its ranks
with the rank's :class:`~mixle_parallel.executors.launchers.base.LaunchContext`; :func:`reference`
runs the same steps in one process on the whole global batch. Same seeds, same data, so the
final parameters can be compared across launchers (bitwise) and with the reference (fp32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend

PLAN = ParallelPlan(dp_replicate=2)
STEPS = 3
LOCAL_BATCH = 4
FEATURES, CLASSES = 4, 3


def make_model() -> nn.Module:
    """The same initial weights on every rank and in the reference (seeded)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def global_batches(data_parallel_size: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step, one (inputs, class targets) batch per data-parallel rank."""
    g = torch.Generator().manual_seed(1234)
    return [
        [(torch.randn(LOCAL_BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (LOCAL_BATCH,), generator=g))
         for _ in range(data_parallel_size)]
        for _ in range(STEPS)
    ]


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum, the same for every launcher and the reference."""
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


def _run(plan: ParallelPlan, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    torch.set_num_threads(1)  # the same kernels on every launcher, whatever OMP_NUM_THREADS it sets
    # admission="unverified": these are launcher tests, not a certified run; a multi-rank prepare()
    # would otherwise certify in situ first. The opt-out is recorded in every receipt.
    session = get_training_backend("torch_native").prepare(
        model, plan=plan, optimizer=make_optimizer, admission="unverified"
    )
    try:
        losses = [session.train_batch(x, y).loss for x, y in batches]
        params = {name: p.detach().tolist() for name, p in model.named_parameters()}
        return {"losses": losses, "params": params, "steps": session.step}
    finally:
        session.close()


def train(context: Any) -> dict[str, Any]:
    """One launched rank: train on its share of every global batch; return what the tests compare."""
    import torch.distributed as dist

    batches = [step[context.data_parallel_index] for step in global_batches(context.plan.data_parallel_size)]
    record = _run(context.plan, make_model(), batches)
    record.update(
        launcher=context.launcher, rank=context.rank, world_size=context.world_size,
        launch_admission=None if context.admission is None else str(context.admission.mode.value),
        coordinate=context.coordinate.as_dict(), local_rank=context.local_rank,
        process_group_rank=dist.get_rank() if dist.is_initialized() else None,
    )
    return record


def reference(plan: ParallelPlan = PLAN) -> dict[str, Any]:
    """The same steps in one process on each whole global batch (no launcher, no process group)."""
    batches = [
        (torch.cat([x for x, _ in step]), torch.cat([y for _, y in step]))
        for step in global_batches(plan.data_parallel_size)
    ]
    return _run(ParallelPlan(), make_model(), batches)
