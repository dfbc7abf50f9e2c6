"""EM encoded-data backends under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableEncodedData(backend)`` fits the harness's Gaussian-mixture workload with this
package's ``MixtureEstimator``/``GaussianEstimator`` through ``encoded_data(..., backend=...,
num_workers=plan.dp_replicate, num_chunks=workload.num_chunks)`` and reports, per iteration, the
combined sufficient statistics and the new parameters. The harness's reference is the same
backend with one worker; EM statistics must agree bitwise. ``em_capabilities(backend)`` is the
identity a certificate binds (and the one ``encoded_data``'s admission gate must check; it lives in
``identity``). ``register_em_verification_targets()`` binds every built-in backend to its adapter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle_parallel.contracts import CollectiveKind, ObservedCollective, ParallelAxis, ParallelPlan
from mixle_parallel.executors.estimation.api import encoded_data
from mixle_parallel.executors.estimation.builtin_backends import BUILTIN_ENCODED_DATA_BACKENDS
from mixle_parallel.executors.estimation.identity import EM_EXECUTOR_VERSION, EMExecutorIdentity, em_capabilities
from mixle_parallel.executors.estimation.models import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
)
from mixle_parallel.executors.registry import register_verification_target

__all__ = [
    "EM_EXECUTOR_VERSION", "EncodedDataTrial", "VerifiableEncodedData", "em_capabilities",
    "register_em_verification_targets",
]

def _flatten(prefix: str, value: Any, out: dict[str, np.ndarray]) -> None:
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _flatten(f"{prefix}/{i}", item, out)
    elif isinstance(value, dict):
        for key in sorted(value):
            _flatten(f"{prefix}/{key}", value[key], out)
    else:
        out[prefix] = np.array(value, dtype=np.float64, copy=True)


class VerifiableEncodedData(EMExecutorIdentity):
    """An EM backend as the harness sees it: it starts its own workers (``verification_launch = "self"``)."""

    verification_launch = "self"

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
        self.handle = encoded_data(workload.data(seed), estimator=self.estimator, backend=backend,
                                   num_workers=plan.dp_replicate, num_chunks=workload.num_chunks)
        self._gathers = 0

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """One E-step and M-step; the combined statistics and the new parameters."""
        result = self.handle.estep(self.estimator, self.model)
        self.model = result.model
        self._gathers = 1 if self.handle.num_workers > 1 else 0
        out: dict[str, np.ndarray] = {}
        _flatten("stats", result.stats, out)
        out["param/weights"] = np.array(self.model.weights, dtype=np.float64)
        out["param/means"] = np.array([c.mu for c in self.model.components], dtype=np.float64)
        out["param/variances"] = np.array([c.sigma2 for c in self.model.components], dtype=np.float64)
        return {"stats:data": out}

    def observed_collectives(self) -> tuple[ObservedCollective, ...]:
        """The gather of the last step (one per step when more than one worker computed chunks)."""
        return (ObservedCollective(CollectiveKind.CUSTOM, (ParallelAxis.DP_REPLICATE,), self._gathers),) \
            if self._gathers else ()

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


def register_em_verification_targets() -> None:
    """Bind each built-in EM backend to its harness adapter (idempotent)."""
    for name in BUILTIN_ENCODED_DATA_BACKENDS:
        if name != "model_parallel":  # a wrapper over another backend, certified through that one
            register_verification_target(name, _verification_factory(name))
