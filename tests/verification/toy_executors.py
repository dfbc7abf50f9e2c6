"""Toy executors for testing the harness: a correct torch DDP one, one that averages gradients over the
wrong group, and a chunked EM one (correct, and one that combines per worker first, breaking the bits).

Module-level classes so spawned gloo ranks can import them.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mixle_parallel.contracts import (
    BackendCapabilities,
    CollectiveKind,
    DistributedUpdate,
    ObservedCollective,
    ParallelPlan,
    PayloadKind,
    StateLayout,
)

DP_AXES = ("dp_replicate", "dp_shard")


def _dp_axes(plan: ParallelPlan) -> tuple[str, ...]:
    return tuple(a for a in DP_AXES if plan.size(a) > 1)


class ToyDDPExecutor:
    """Plain DDP over the whole data-parallel group (dp_replicate x dp_shard), SGD."""

    verification_launch = "gloo"
    name = "toy_ddp"
    wrap_ddp = True
    """False: no DDP wrapper (the zoo's members average by hand, or not at all)."""
    manual_average: str | None = None
    """'all_gather': average gradients by gathering every rank's and taking the mean."""
    grad_scale = 1.0
    """Extra factor on the committed gradients (1.0: none)."""
    no_sync_works = True
    """False: the non-commit micro-steps of gradient accumulation run outside ``no_sync()`` (they all-reduce)."""

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(name=self.name, axes=frozenset(DP_AXES), precisions=frozenset({"fp32", "fp64"}))

    @property
    def version(self) -> str:
        return "0.1"

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        axes = _dp_axes(plan)
        collective = CollectiveKind.ALL_REDUCE if axes else CollectiveKind.NONE
        grad = DistributedUpdate(f"grad:{','.join(axes) or 'local'}", PayloadKind.GRADIENT, collective, axes,
                                 StateLayout.REPLICATED, False)
        return (grad, DistributedUpdate("optimizer:local", PayloadKind.PARAMETER, CollectiveKind.NONE, (),
                                        StateLayout.REPLICATED, True))

    def reduction_groups(self, plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
        """The rank groups gradients are averaged over."""
        return plan.data_parallel_group_ranks()

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> _ToyTrial:
        return _ToyTrial(self, workload, plan, precision, seed, rank)


class WrongGroupDDPExecutor(ToyDDPExecutor):
    """Deliberately wrong: averages gradients over dp_shard only, though it declares the whole dp group."""

    name = "toy_ddp_wrong_group"

    def reduction_groups(self, plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
        return plan.axis_group_ranks("dp_shard")


class _ToyTrial:
    def __init__(self, executor: ToyDDPExecutor, workload: Any, plan: ParallelPlan, precision: str, seed: int,
                 rank: int) -> None:
        import torch
        import torch.distributed as dist

        from mixle_parallel.verification.harness.workloads import torch_dtype

        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.dtype = torch_dtype(precision)
        self.grad_node = executor.describe_updates(plan)[0].node_id
        self.module = workload.build_module(seed).to(self.dtype)
        mine = None
        for ranks in executor.reduction_groups(plan):
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine = group
        self.group, self.executor = mine, executor
        self.ddp = (torch.nn.parallel.DistributedDataParallel(self.module, process_group=mine)
                    if executor.wrap_ddp else self.module)
        self.optimizer = workload.make_optimizer(self.module.parameters())

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        if inputs.is_floating_point():
            inputs = inputs.to(self.dtype)
        self.optimizer.zero_grad(set_to_none=True)
        calls = self.plan.gradient_accumulation_steps  # equal micro-batches: the mean of their mean losses
        for i, (x, y) in enumerate(zip(inputs.tensor_split(calls), targets.tensor_split(calls))):
            skip_sync = i < calls - 1 and self.executor.wrap_ddp and self.executor.no_sync_works
            with self.ddp.no_sync() if skip_sync else contextlib.nullcontext():
                (self.workload.loss(self.ddp(x), y) / calls).backward()
        self._average_by_hand()
        grads = {f"grad/{n}": p.grad.detach().clone() for n, p in self.module.named_parameters()}
        self.optimizer.step()
        params = {f"param/{n}": p.detach().clone() for n, p in self.module.named_parameters()}
        return {self.grad_node: grads, "optimizer:local": params}

    def _average_by_hand(self) -> None:
        import torch
        import torch.distributed as dist

        for p in self.module.parameters():
            if self.executor.manual_average == "all_gather":
                parts = [torch.empty_like(p.grad) for _ in range(dist.get_world_size(self.group))]
                dist.all_gather(parts, p.grad.contiguous(), group=self.group)
                p.grad.copy_(torch.stack(parts).mean(0))
            if self.executor.grad_scale != 1.0:
                p.grad.mul_(self.executor.grad_scale)

    def close(self) -> None:
        del self.ddp


# ---- EM ---------------------------------------------------------------------------------
def _chunk_stats(chunk: np.ndarray, model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = chunk[:, None]
    logp = (-0.5 * (x - model["means"]) ** 2 / model["variances"] - 0.5 * np.log(2 * np.pi * model["variances"])
            + np.log(model["weights"]))
    resp = np.exp(logp - logp.max(axis=1, keepdims=True))
    resp /= resp.sum(axis=1, keepdims=True)
    return {"weight_sums": resp.sum(0), "sum_x": (resp * x).sum(0), "sum_xx": (resp * x * x).sum(0)}


class ToyEMExecutor:
    """Chunked EM on a thread pool of ``plan.dp_replicate`` workers; statistics combined in chunk order."""

    verification_launch = "self"
    name = "toy_em"

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(name=self.name, axes=frozenset({"dp_replicate"}), precisions=frozenset({"fp64"}))

    @property
    def version(self) -> str:
        return "0.1"

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        return (DistributedUpdate("stats:data", PayloadKind.SUFFICIENT_STATISTIC, CollectiveKind.CUSTOM,
                                  ("dp_replicate",), StateLayout.REPLICATED, False),)

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> _EMTrial:
        return _EMTrial(self, workload, plan, seed)

    def combine(self, parts: list[dict[str, np.ndarray]], owners: list[int]) -> dict[str, np.ndarray]:
        total = parts[0]
        for part in parts[1:]:
            total = {k: total[k] + part[k] for k in total}
        return total


class PerWorkerEMExecutor(ToyEMExecutor):
    """Deliberately wrong: sums each worker's chunks first, then the workers (bits depend on the worker count)."""

    name = "toy_em_per_worker"

    def combine(self, parts: list[dict[str, np.ndarray]], owners: list[int]) -> dict[str, np.ndarray]:
        per_worker: dict[int, dict[str, np.ndarray]] = {}
        for part, owner in zip(parts, owners):
            current = per_worker.get(owner)
            per_worker[owner] = part if current is None else {k: current[k] + part[k] for k in part}
        return super().combine([per_worker[w] for w in sorted(per_worker)], sorted(per_worker))


class _EMTrial:
    def __init__(self, executor: ToyEMExecutor, workload: Any, plan: ParallelPlan, seed: int) -> None:
        self.executor, self.workers = executor, plan.dp_replicate
        self.chunks = workload.chunks(seed)
        self.model = workload.initial_model(seed)
        self.pool = ThreadPoolExecutor(self.workers)
        self.combines = 0

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        owners = [c % self.workers for c in range(len(self.chunks))]
        parts = list(self.pool.map(lambda c: _chunk_stats(c, self.model), self.chunks))
        stats = self.executor.combine(parts, owners)
        self.combines = 1 if self.workers > 1 else 0
        n = stats["weight_sums"]
        mu = stats["sum_x"] / n
        variances = stats["sum_xx"] / n - mu * mu
        self.model = {"weights": n / n.sum(), "means": mu, "variances": variances}
        return {"stats:data": {**{f"stats/{k}": v for k, v in stats.items()},
                               **{f"param/{k}": v for k, v in self.model.items()}}}

    def observed_collectives(self) -> tuple[ObservedCollective, ...]:
        return (ObservedCollective("custom", ("dp_replicate",), self.combines),) if self.combines else ()

    def close(self) -> None:
        self.pool.shutdown()
