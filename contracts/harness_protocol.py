"""What the verification harness asks of an executor: open a trial, run steps, report observables.

Pure structural types (no torch). An executor that implements ``VerifiableExecutor`` can be
measured by ``mixle_parallel.verification.verify`` and certified; the harness never imports it.

Protocol, in the order the harness calls it (one rank of a gloo mesh, or once in the calling
process for executors that manage their own workers, ``verification_launch == "self"``):

1. ``executor.open_trial(workload, plan, precision=..., seed=..., rank=..., world_size=...)``
   builds the model/optimizer (or worker pool) for ``workload`` exactly as a real run would.
   Collectives issued here are set-up (initial broadcasts, shape checks) and are not judged.
2. ``trial.step(step)`` runs one optimizer step (one EM iteration) on the workload's batch for
   ``step`` and returns ``{node_id: {observable_key: array}}`` for every declared update:
   full (unsharded, ``DTensor.full_tensor()``) values, keys from the workload's reference
   vocabulary (``loss``, ``grad/<param>``, ``param/<param>``, ``output``, ``stats/<name>``).
   Every collective issued inside ``step`` is traced and must match the declaration.
3. ``trial.close()`` releases what ``open_trial`` built (never the process group, which the
   harness owns).

Self-launched executors (EM backends with their own worker pools) may also implement
``trial.observed_collectives() -> tuple[ObservedCollective, ...]`` for the last step; the
harness records such counts as self-reported in the evidence notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .capabilities import BackendCapabilities
from .plan import ParallelPlan
from .updates import DistributedUpdate

VERIFICATION_LAUNCHES = frozenset({"gloo", "self"})
"""How the harness starts ranks: ``gloo`` (it spawns a CPU mesh) or ``self`` (the executor does)."""


@runtime_checkable
class VerificationTrial(Protocol):
    """One executor instance set up for a workload on one rank; the harness drives its steps."""

    def step(self, step: int) -> Mapping[str, Mapping[str, Any]]: ...

    def close(self) -> None: ...


@runtime_checkable
class VerifiableExecutor(Protocol):
    """An executor the harness can measure: capabilities, version, declared updates, trials."""

    @property
    def capabilities(self) -> BackendCapabilities: ...

    @property
    def version(self) -> str: ...

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]: ...

    def open_trial(
        self,
        workload: Any,
        plan: ParallelPlan,
        *,
        precision: str,
        seed: int,
        rank: int,
        world_size: int,
    ) -> VerificationTrial: ...


@runtime_checkable
class TrainingWorkload(Protocol):
    """A small training problem both the executor and the single-process reference run.

    Executors build the module with ``build_module(seed)`` (identical initial weights on every
    rank), take their shard with ``local_batch(step, seed, plan, rank)`` (the global batch cut
    into ``plan.data_parallel_size`` equal contiguous shards in data-parallel order; tp/cp peers
    get the same shard), compute ``loss(output, target)`` (a mean, so averaging the shards'
    gradients equals the global gradient) and step ``make_optimizer(params)``.
    """

    name: str
    steps: int

    def build_module(self, seed: int) -> Any: ...

    def loss(self, output: Any, target: Any) -> Any: ...

    def make_optimizer(self, params: Any) -> Any: ...

    def global_batch(self, step: int, seed: int) -> tuple[Any, Any]: ...

    def local_batch(self, step: int, seed: int, plan: ParallelPlan, rank: int) -> tuple[Any, Any]: ...


@runtime_checkable
class EstimationWorkload(Protocol):
    """A small EM problem: data cut into a fixed number of chunks, an initial model, iterations.

    Chunk boundaries depend only on ``num_chunks``, never on the worker count; the reference is
    the same executor run on one process, and statistics must agree bitwise.
    """

    name: str
    steps: int
    num_chunks: int

    def data(self, seed: int) -> Any: ...

    def initial_model(self, seed: int) -> Mapping[str, Any]: ...
