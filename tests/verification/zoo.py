"""The zoo of broken backends: each one a realistic bug that verify, certify and conformance must refuse.

Training members are small torch executors on a gloo world of 2 (4 for the wrong group); EM members
are third-party encoded-data backends registered by name (chunk runners with a bug) or toy EM
executors. ``ZOO`` lists every member with its plan, workload, and the update whose failure must be
named. Module-level classes so spawned gloo ranks can import them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mixle_parallel.contracts import CollectiveKind, DistributedUpdate, ParallelPlan, PayloadKind, StateLayout
from tests.verification.toy_executors import (
    PerWorkerEMExecutor,
    ToyDDPExecutor,
    ToyEMExecutor,
    WrongGroupDDPExecutor,
    _dp_axes,
)


# ---- training ---------------------------------------------------------------------------------
class DoubleAverageDDP(ToyDDPExecutor):
    """Averages gradients twice: DDP already divides by the world size, and the step divides again."""

    name = "zoo_double_average"
    grad_scale = 0.5  # the zoo runs it on 2 data-parallel ranks


class NoAverageDDP(ToyDDPExecutor):
    """Never averages: each rank steps on its own shard's gradient (the DDP wrapper was left out)."""

    name = "zoo_no_average"
    wrap_ddp = False


class BrokenNoSyncDDP(ToyDDPExecutor):
    """Gradient accumulation whose ``no_sync()`` is never entered: DDP all-reduces on every micro-step.

    The numbers stay right (the average of averages is the average), so only the wire shows it: an
    all-reduce in a backward before the step's last."""

    name = "zoo_broken_no_sync"
    no_sync_works = False


class AccumulatingDDP(ToyDDPExecutor):
    """The correct neighbour of ``BrokenNoSyncDDP``: the same accumulation with a working ``no_sync()``."""

    name = "zoo_accumulating_ddp"


class GradientsInTheMetricAllReduce(ToyDDPExecutor):
    """Declares FSDP-style reduce-scatter of gradients and a metric all-reduce, but packs the gradients into
    the metric's all-reduce after backward: on gloo (reduce-scatter recorded as all-reduce) the one
    all-reduce over dp_shard per step looks like both declarations unless each needs its own entry."""

    name = "zoo_gradients_in_the_metric_all_reduce"
    wrap_ddp = False

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        axes = _dp_axes(plan)
        return (DistributedUpdate(f"grad:{','.join(axes)}", PayloadKind.GRADIENT, CollectiveKind.REDUCE_SCATTER, axes,
                                  StateLayout.SHARDED, False),
                DistributedUpdate("metric:dp", PayloadKind.SUFFICIENT_STATISTIC, CollectiveKind.ALL_REDUCE, axes,
                                  StateLayout.REPLICATED, False))

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> _FusedMetricTrial:
        return _FusedMetricTrial(self, workload, plan, precision, seed, rank)


class _FusedMetricTrial:
    def __init__(self, executor: GradientsInTheMetricAllReduce, workload: Any, plan: ParallelPlan, precision: str,
                 seed: int, rank: int) -> None:
        from mixle_parallel.verification.harness.workloads import torch_dtype

        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.dtype = torch_dtype(precision)
        self.grad_node = executor.describe_updates(plan)[0].node_id
        self.module = workload.build_module(seed).to(self.dtype)
        self.optimizer = workload.make_optimizer(self.module.parameters())

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        import torch
        import torch.distributed as dist

        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.workload.loss(self.module(inputs.to(self.dtype)), targets)
        loss.backward()
        params = list(self.module.parameters())
        flat = torch.cat([loss.detach().reshape(1)] + [p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # the metric all-reduce, carrying every gradient too
        flat /= dist.get_world_size()
        offset = 1
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        grads = {f"grad/{n}": p.grad.detach().clone() for n, p in self.module.named_parameters()}
        self.optimizer.step()
        return {self.grad_node: grads, "metric:dp": {"loss": flat[0].clone()}}

    def close(self) -> None:
        self.module = None


class _WrapsTorchNative:
    """A broken variant of the built-in torch_native adapter: its capabilities, version and declared updates."""

    verification_launch = "gloo"

    def __init__(self) -> None:
        from mixle_parallel.executors.torch.harness_adapter import VerifiableTorchNative

        self._inner = VerifiableTorchNative()
        self.capabilities, self.version = self._inner.capabilities, self._inner.version

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        return self._inner.describe_updates(plan)


class SkipsRowwiseAllReduce(_WrapsTorchNative):
    """torch_native TP whose row-wise layers skip their all-reduce (``RowwiseParallel(output_layouts=Partial())``:
    each rank hands on its partial sum); gradients, parameters and loss are patched from a correct shadow
    session, so only the TP layers' outputs give it away."""

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> _PatchedTPTrial:
        return _PatchedTPTrial(self._inner._backend, workload, plan, precision, seed, rank)


class _PatchedTPTrial:
    def __init__(self, backend: Any, workload: Any, plan: ParallelPlan, precision: str, seed: int, rank: int) -> None:
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor.parallel import RowwiseParallel

        from mixle_parallel.executors.torch.harness_adapter import TorchNativeTrial

        broken = {path: RowwiseParallel(output_layouts=Partial()) if style == "rowwise" else style
                  for path, style in workload.tp_plan().items()}
        self.broken = TorchNativeTrial(backend, workload, plan, precision=precision, seed=seed, rank=rank,
                                       tp_plan=broken)
        self.shadow = TorchNativeTrial(backend, workload, plan, precision=precision, seed=seed, rank=rank)

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        forward = self.broken.step(step)["act:tp"]
        return {**self.shadow.step(step), "act:tp": forward}

    def close(self) -> None:
        self.broken.close()
        self.shadow.close()


class ReceiptsCountElements(_WrapsTorchNative):
    """torch_native whose comm taps count elements instead of bytes: at fp32 its receipts under-report the
    bytes that crossed the wire four times (the numbers and the collectives are right)."""

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> Any:
        trial = self._inner.open_trial(workload, plan, precision=precision, seed=seed, rank=rank,
                                       world_size=world_size)
        tap = trial.session._tap  # the session's comm-layer counter (DDP / FSDP2)
        count = tap.add
        tap.add = lambda kind, nbytes, n=1: count(kind, nbytes // 4, n)  # the bug: element counts reported as bytes
        return trial


class GatherInsteadOfAllReduce(ToyDDPExecutor):
    """Declares an all-reduce it never runs; averages with an all-gather it never declares (same numbers)."""

    name = "zoo_undeclared_all_gather"
    wrap_ddp = False
    manual_average = "all_gather"


class ZeroShardedSGD(ToyDDPExecutor):
    """ZeRO-style: gradients all-reduced, each rank steps the parameters it owns, owners' values all-gathered."""

    name = "zoo_zero_sgd"
    skip_gather: int | None = None

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        axes = _dp_axes(plan)
        return (DistributedUpdate("grad:dp", PayloadKind.GRADIENT, CollectiveKind.ALL_REDUCE, axes,
                                  StateLayout.REPLICATED, False),
                DistributedUpdate("param:dp", PayloadKind.PARAMETER, CollectiveKind.ALL_GATHER, axes,
                                  StateLayout.SHARDED, False))

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> _ZeroTrial:
        return _ZeroTrial(self, workload, plan, precision, seed, rank)


class SkipsOneAllGather(ZeroShardedSGD):
    """ZeRO-style, but the all-gather of the last parameter is skipped: non-owners keep its stale value."""

    name = "zoo_skips_one_all_gather"
    skip_gather = -1


class _ZeroTrial:
    def __init__(self, executor: ZeroShardedSGD, workload: Any, plan: ParallelPlan, precision: str, seed: int,
                 rank: int) -> None:
        from mixle_parallel.verification.harness.workloads import torch_dtype

        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.dtype = torch_dtype(precision)
        self.module = workload.build_module(seed).to(self.dtype)
        self.params = list(self.module.named_parameters())
        self.world = plan.world_size
        self.owned = [p for i, (_, p) in enumerate(self.params) if i % self.world == rank]
        self.optimizer = workload.make_optimizer(self.owned)
        self.skip = None if executor.skip_gather is None else range(len(self.params))[executor.skip_gather]

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        import torch
        import torch.distributed as dist

        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        self.module.zero_grad(set_to_none=True)
        self.workload.loss(self.module(inputs.to(self.dtype)), targets).backward()
        for _, p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= self.world
        grads = {f"grad/{n}": p.grad.detach().clone() for n, p in self.params}
        self.optimizer.step()
        with torch.no_grad():
            for i, (_, p) in enumerate(self.params):
                if i == self.skip:
                    continue
                parts = [torch.empty_like(p) for _ in range(self.world)]
                dist.all_gather(parts, p.detach().contiguous())
                p.copy_(parts[i % self.world])
        params = {f"param/{n}": p.detach().clone() for n, p in self.params}
        return {"grad:dp": grads, "param:dp": params}

    def close(self) -> None:
        self.params = []


# ---- EM: third-party encoded-data backends with a bug in their chunk runner --------------------
def _runner_backend(runner_class: type) -> Any:
    from mixle_parallel.executors.estimation.handle import handle_from_runner

    def factory(data: Any, *, num_workers: int | None = None, **params: Any) -> Any:
        return handle_from_runner(runner_class(num_workers or 1), data, **params)

    factory.__name__ = f"{runner_class.__name__}_backend"
    # what encoded_data asks a third-party factory before any worker starts (threads: a world of one)
    factory.encoded_data_options = frozenset({"num_workers"})  # type: ignore[attr-defined]
    factory.planned_workers = lambda options: options.num_workers or 1  # type: ignore[attr-defined]
    factory.worker_processes = False  # type: ignore[attr-defined]
    return factory


def _runner_classes() -> dict[str, type]:
    from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
    from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk

    class CorrectRunner(LocalChunkRunner):
        """A third party's correct runner (the local thread pool under its own name)."""

        name = "zoo_em_correct"

    class IgnoresDataRunner(LocalChunkRunner):
        """Allocates each worker's receive buffer and never copies the chunk into it (all zeros)."""

        name = "zoo_em_ignores_data"

        def scatter(self, chunks: Any) -> None:
            super().scatter([EncodedChunk(c.chunk_id, c.start, c.stop, np.zeros_like(c.data)) for c in chunks])

    class DropsSecondHalfRunner(LocalChunkRunner):
        """Ships only the first half of the chunks' rows (an off-by-half in the partitioner)."""

        name = "zoo_em_drops_second_half"

        def scatter(self, chunks: Any) -> None:
            half = len(chunks) // 2
            super().scatter([c if c.chunk_id < half else EncodedChunk(c.chunk_id, c.start, c.stop, c.data[:0])
                             for c in chunks])

    class DropsLastBatchRunner(LocalChunkRunner):
        """Batches each chunk by 16 rows with drop_last=True: the uneven tail of every chunk is lost."""

        name = "zoo_em_drops_last_batch"

        def scatter(self, chunks: Any) -> None:
            super().scatter([EncodedChunk(c.chunk_id, c.start, c.stop, c.data[: len(c.data) // 16 * 16])
                             for c in chunks])

    return {cls.name: cls for cls in (CorrectRunner, IgnoresDataRunner, DropsSecondHalfRunner, DropsLastBatchRunner)}


def register_zoo_backends() -> tuple[str, ...]:
    """Register the zoo's encoded-data backends by name (idempotent); their names."""
    from mixle_parallel.executors.registry import register_encoded_data_backend

    for name, cls in _runner_classes().items():
        if name not in _FACTORIES:
            _FACTORIES[name] = _runner_backend(cls)
        register_encoded_data_backend(name, _FACTORIES[name])
    return tuple(_FACTORIES)


_FACTORIES: dict[str, Any] = {}


class NoisyEMExecutor(ToyEMExecutor):
    """Combines with an unseeded perturbation (stands in for arrival-order combining): bits differ per run."""

    name = "zoo_em_nondeterministic"

    def combine(self, parts: list[dict[str, np.ndarray]], owners: list[int]) -> dict[str, np.ndarray]:
        order = np.random.default_rng().permutation(len(parts))
        return super().combine([parts[i] for i in order], [owners[i] for i in order])


# ---- the list -----------------------------------------------------------------------------------
class Member(NamedTuple):
    """One broken backend: how to name it, where to run it, and the update that must be named failing."""

    bug: str
    spec: Any
    plan: ParallelPlan
    workload: str
    precision: str
    update: str
    checks: frozenset[str]


_DP2, _EM3 = ParallelPlan(dp_shard=2), ParallelPlan(dp_replicate=3)
_DP2_ACC = ParallelPlan(dp_shard=2, gradient_accumulation_steps=2)
_TOYS = "tests.verification.zoo"

ZOO: tuple[Member, ...] = (
    Member("averages gradients twice", f"{_TOYS}:DoubleAverageDDP", _DP2, "mlp", "fp32", "grad:dp_shard",
           frozenset({"numerics"})),
    Member("does not average gradients at all", f"{_TOYS}:NoAverageDDP", _DP2, "mlp", "fp32", "grad:dp_shard",
           frozenset({"numerics", "collectives"})),
    Member("reduces over the wrong group", f"{_TOYS}:WrongGroupDDPExecutor", ParallelPlan(dp_replicate=2, dp_shard=2),
           "mlp", "fp32", "grad:dp_replicate,dp_shard", frozenset({"numerics"})),
    Member("skips the all-gather of one parameter", f"{_TOYS}:SkipsOneAllGather", _DP2, "mlp", "fp32", "param:dp",
           frozenset({"numerics"})),
    Member("declares a collective it never runs, runs one it never declares", f"{_TOYS}:GatherInsteadOfAllReduce",
           _DP2, "mlp", "fp32", "grad:dp_shard", frozenset({"collectives"})),
    Member("runs the all-reduce on non-commit micro-steps (no_sync broken)", f"{_TOYS}:BrokenNoSyncDDP", _DP2_ACC,
           "mlp", "fp32", "grad:dp_shard", frozenset({"collectives"})),
    Member("reduces gradients only inside the metric all-reduce (declares a reduce-scatter)",
           f"{_TOYS}:GradientsInTheMetricAllReduce", _DP2, "mlp", "fp32", "grad:dp_shard", frozenset({"collectives"})),
    Member("receipts under-report the bytes sent (elements counted as bytes)", f"{_TOYS}:ReceiptsCountElements",
           _DP2, "mlp", "fp32", "grad:dp_shard", frozenset({"receipts"})),
    Member("a row-parallel layer skips its all-reduce (gradients patched to look right)",
           f"{_TOYS}:SkipsRowwiseAllReduce", ParallelPlan(tp=2), "mlp", "fp32", "act:tp", frozenset({"numerics"})),
    Member("ignores the data", "zoo_em_ignores_data", _EM3, "gaussian_mixture", "fp64", "stats:data",
           frozenset({"numerics"})),
    Member("drops the second half of the data", "zoo_em_drops_second_half", _EM3, "gaussian_mixture", "fp64",
           "stats:data", frozenset({"numerics"})),
    Member("drops the last uneven batch of every chunk", "zoo_em_drops_last_batch", _EM3, "gaussian_mixture",
           "fp64", "stats:data", frozenset({"numerics"})),
    Member("combines per worker first (bits depend on the worker count)", f"{_TOYS}:PerWorkerEMExecutor", _EM3,
           "gaussian_mixture", "fp64", "stats:data", frozenset({"determinism"})),
    Member("non-deterministic combine order", f"{_TOYS}:NoisyEMExecutor", _EM3, "gaussian_mixture", "fp64",
           "stats:data", frozenset({"determinism"})),
)
"""Every broken backend the harness must refuse, with the update and checks it must name."""

ADMITTED: tuple[tuple[str, Any, ParallelPlan, str, str], ...] = (
    ("toy DDP (the zoo's correct base)", f"{_TOYS}:ToyDDPExecutor", _DP2, "mlp", "fp32"),
    ("ZeRO-style SGD (correct base of the skipped all-gather)", f"{_TOYS}:ZeroShardedSGD", _DP2, "mlp", "fp32"),
    ("DDP accumulating with a working no_sync", f"{_TOYS}:AccumulatingDDP", _DP2_ACC, "mlp", "fp32"),
    ("a correct third-party encoded-data backend", "zoo_em_correct", _EM3, "gaussian_mixture", "fp64"),
    ("toy EM", f"{_TOYS}:ToyEMExecutor", _EM3, "gaussian_mixture", "fp64"),
)
"""Correct neighbours of the zoo members (same code paths without the bug), which must be admitted."""

__all__ = [
    "ADMITTED", "ZOO", "AccumulatingDDP", "BrokenNoSyncDDP", "DoubleAverageDDP", "GatherInsteadOfAllReduce",
    "GradientsInTheMetricAllReduce", "Member", "NoAverageDDP", "NoisyEMExecutor", "PerWorkerEMExecutor",
    "ReceiptsCountElements", "SkipsOneAllGather", "SkipsRowwiseAllReduce", "ToyDDPExecutor", "ToyEMExecutor",
    "WrongGroupDDPExecutor", "ZeroShardedSGD", "register_zoo_backends",
]
