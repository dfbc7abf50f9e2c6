"""Structural types for executors, so verification works on objects without importing executors."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .capabilities import BackendCapabilities
from .plan import ParallelPlan
from .updates import DistributedUpdate


@runtime_checkable
class AdmissibleExecutor(Protocol):
    """Anything with a capability declaration and a version can be certified and admitted."""

    @property
    def capabilities(self) -> BackendCapabilities: ...

    @property
    def version(self) -> str: ...


@runtime_checkable
class TrainingBackend(AdmissibleExecutor, Protocol):
    """A training executor: declares its updates and prepares a session for a module and plan."""

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]: ...

    def prepare(self, module: Any, *, plan: ParallelPlan, **kwargs: Any) -> Any: ...


@runtime_checkable
class DistributedTrainingSession(Protocol):
    """mixle 0.8.2's session shape: a materialized model, optimizer, mesh and resumable step clock."""

    plan: ParallelPlan
    capabilities: BackendCapabilities

    def train_batch(self, inputs: Any, targets: Any) -> Any: ...

    def finish_accumulation(self) -> Any: ...

    def discard_accumulation(self) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class DistributedTrainingBackend(Protocol):
    """mixle 0.8.2's backend shape (capabilities + prepare); ours also declare updates (``TrainingBackend``)."""

    @property
    def capabilities(self) -> BackendCapabilities: ...

    def prepare(self, module: Any, *, plan: ParallelPlan, **kwargs: Any) -> Any: ...
