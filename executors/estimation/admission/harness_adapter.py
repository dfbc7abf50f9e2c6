"""EM encoded-data backends under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableEncodedData(backend)`` fits the harness's Gaussian-mixture workload with this
package's ``MixtureEstimator``/``GaussianEstimator`` through ``encoded_data(..., backend=...,
num_workers=plan.dp_replicate, num_chunks=workload.num_chunks)`` and reports, per iteration, the
combined sufficient statistics and the new parameters under the workload's keys, and, as its
collective count, the messages the backend handed to its transport in that iteration
(``observed_messages``; the harness judges it against ``messages_per_step`` when declared). The harness
compares them with its independent one-piece reference (``em_reference``) and, bitwise, with the
same backend on one worker and with the fixed fold order of one process (``same_bits_reference``: the
``local`` backend), so chunk results folded out of order fail ``verify``, ``conformance`` and ``certify``.
``em_capabilities(backend)`` is the identity a certificate binds (and the one ``encoded_data``'s admission
gate must check; it lives in ``identity``). ``register_em_verification_targets()`` binds every built-in
backend to its adapter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....contracts import CollectiveKind, ObservedCollective, ParallelAxis, ParallelPlan
from ....contracts.estimation import EncodedDataHandle
from ...registry import register_encoded_data_verification, register_verification_target
from ..api import encoded_data
from ..backends.backend_declaration import backend_declaration
from ..backends.builtin_backends import BUILTIN_ENCODED_DATA_BACKENDS
from ..em_pass.runner_protocols import MeteredHandle
from ..models import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
)
from .executor_identity import (
    EM_EXECUTOR_VERSION,
    EMExecutorIdentity,
    em_capabilities,
    em_identity_name,
)

__all__ = [
    "EM_EXECUTOR_VERSION", "EncodedDataTrial", "VerifiableEncodedData", "em_capabilities",
    "register_em_verification_targets",
]

def _observables(stats: Any, model: MixtureDistribution) -> dict[str, np.ndarray]:
    """The workload's observable keys (``em_reference.EM_OBSERVABLE_KEYS``) from a mixture's statistics."""
    counts, components = stats
    per = np.array([tuple(c) for c in components], dtype=np.float64).reshape(len(components), 3)
    return {
        "stats/weight_sums": np.array(counts, dtype=np.float64, copy=True),
        "stats/sum_x": per[:, 1].copy(),
        "stats/sum_xx": per[:, 2].copy(),
        "param/weights": np.array(model.weights, dtype=np.float64, copy=True),
        "param/means": np.array([c.mu for c in model.components], dtype=np.float64),
        "param/variances": np.array([c.sigma2 for c in model.components], dtype=np.float64),
    }


def observed_messages(handle: EncodedDataHandle) -> int:
    """Messages of the handle's last E-step, counted where they cross: the runner's transport counter
    (``transport_messages``: pipe writes and reads, mpi/torch.distributed object collectives, dask/ray
    calls and channel frames, Spark tasks and collected records, thread-pool hand-offs), else, for a
    runner that keeps none, two per task its workers ran and answered (the metering wrapper's requests,
    seen on the workers' side of the transport). Never derived from the worker count."""
    if not isinstance(handle, MeteredHandle):
        return 0
    counted = handle.last_transport_messages
    if counted is not None:
        return int(counted)
    return 2 * sum(int(r.extra.get("requests", 0)) for r in handle.last_rank_records)


class VerifiableEncodedData(EMExecutorIdentity):
    """An EM backend as the harness sees it: it starts its own workers (``verification_launch = "self"``)."""

    verification_launch = "self"

    def same_bits_reference(self) -> VerifiableEncodedData:
        """What this backend claims bit for bit: the fixed fold order of one process (the ``local`` backend on one
        worker); the harness holds the run to it, as the run-time audit holds every pass to its reference."""
        return VerifiableEncodedData("local")

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> EncodedDataTrial:
        """An encoded-data handle over the workload's data with ``plan.dp_replicate`` workers."""
        return EncodedDataTrial(self.backend, workload, plan, seed)


class EncodedDataTrial:
    """One handle driven iteration by iteration."""

    def __init__(self, backend: str, workload: Any, plan: ParallelPlan, seed: int) -> None:
        init = workload.initial_model(seed)
        self.estimator = MixtureEstimator([GaussianEstimator() for _ in init["weights"]])
        self.model = MixtureDistribution(
            [GaussianDistribution(float(m), float(v)) for m, v in zip(init["means"], init["variances"])],
            init["weights"])
        honoured = backend_declaration(backend).options
        # SPMD backends (mpi, torchrun) take their workers from the launcher: the job's ranks are the plan's world
        workers: dict[str, Any] = ({"num_workers": plan.dp_replicate}
                                   if honoured is None or "num_workers" in honoured else {})
        # audit=False: the harness measures the pass itself; audit replays would add traffic to some rounds' counts
        self.handle = encoded_data(workload.data(seed), estimator=self.estimator, backend=backend,
                                   num_chunks=workload.num_chunks, audit=False, **workers)
        self._messages = 0

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """One E-step and M-step; the combined statistics and the new parameters."""
        result = self.handle.estep(self.estimator, self.model)
        self.model = result.model
        self._messages = observed_messages(self.handle)
        return {"stats:data": _observables(result.stats, self.model)}

    def observed_collectives(self) -> tuple[ObservedCollective, ...]:
        """The last step's traffic as observed: the messages the backend handed to and took from its transport."""
        return (ObservedCollective(CollectiveKind.CUSTOM, (ParallelAxis.DP_REPLICATE,), self._messages),) \
            if self._messages else ()

    def close(self) -> None:
        """Release the workers."""
        self.handle.close()


_VERIFICATION_FACTORIES: dict[str, Any] = {}


def _verification_factory(name: str) -> Any:
    """A cached zero-argument factory of the harness adapter for EM on ``name``."""
    if name not in _VERIFICATION_FACTORIES:
        def build() -> VerifiableEncodedData:
            return VerifiableEncodedData(name)

        _VERIFICATION_FACTORIES[name] = build
    return _VERIFICATION_FACTORIES[name]


def _registered_target(name: str) -> VerifiableEncodedData:
    """The harness adapter of a registered encoded-data backend that has no target of its own."""
    if name in BUILTIN_ENCODED_DATA_BACKENDS and "[" not in em_identity_name(name):
        raise KeyError(f"{name!r} wraps another backend and is certified through that one (e.g. 'local', 'mp')")
    return VerifiableEncodedData(name)


def register_em_verification_targets() -> None:
    """Bind each built-in EM backend to its harness adapter, and any other registered one by name (idempotent)."""
    register_encoded_data_verification(_registered_target)
    for name in BUILTIN_ENCODED_DATA_BACKENDS:
        if name not in ("model_parallel", "lightning"):  # wrappers over another backend, certified through it
            register_verification_target(name, _verification_factory(name))
