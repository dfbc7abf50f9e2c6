"""What runs inside each verification rank: open trials, drive steps, trace collectives, ship numpy back."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...contracts import ParallelPlan
from ..backend_names import harness_target
from ..capability import claim_harness_capability, harness_admitted
from .collectives import FlightRecorderTrace, last_record_id, point_to_point_trace
from .mesh import fresh_process_group
from .phases import PhaseTracker
from .receipt_check import receipt_summary

_HARNESS = claim_harness_capability("mixle_parallel.verification.harness")
"""The harness's capability: ``run_trials`` enters it so the gate admits the trials (mode ``verifying``)."""


def resolve_executor(spec: Any) -> Any:
    """An executor from an object, a ``"module:attr"`` string or a registered backend name
    (``backend_names.harness_target``); a class or factory is called once."""
    spec = harness_target(spec)
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"executor spec {spec!r} must look like 'package.module:attribute'")
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"cannot import {module_name!r} for executor spec {spec!r}: {exc}") from exc
        for part in attr.split("."):
            if not hasattr(target, part):
                raise AttributeError(f"{module_name!r} has no attribute {attr!r} (executor spec {spec!r})")
            target = getattr(target, part)
        spec = target
    if inspect.isclass(spec) or (callable(spec) and not hasattr(spec, "capabilities")):
        spec = spec()
    for needed in ("capabilities", "version", "describe_updates"):
        if not hasattr(spec, needed):
            raise TypeError(f"{type(spec).__name__} is not an executor: it has no {needed!r} "
                            "(see contracts.VerifiableExecutor)")
    return spec


def to_numpy(value: Any) -> np.ndarray:
    """A full, CPU, numpy copy of a tensor/DTensor/array (low-precision floats widened to float32).

    A zero-argument callable is called first: trials return sharded values that way (e.g. a local
    activation and how to gather it), so the unsharding collectives run after the traced step.
    """
    if callable(value) and not hasattr(value, "detach"):
        value = value()
    if hasattr(value, "detach"):
        tensor = value.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.cpu()
        if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
            tensor = tensor.float()
        return tensor.numpy().copy()
    return np.array(value, copy=True)


def _observables(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"trial.step must return {{node_id: {{key: array}}}}, got {type(raw).__name__}")
    return {str(node): {str(k): to_numpy(v) for k, v in values.items()} for node, values in raw.items()}


def run_trials(executor: Any, workload: Any, plan: ParallelPlan, *, precision: str, seeds: Sequence[int],
               repeats: int, rank: int, world_size: int, trace: bool, fresh_group: Any = None) -> list[dict[str, Any]]:
    """Every (seed, repeat) trial on this rank: per step the observables and the traced collectives."""
    tracer = None
    if trace:
        tracer = FlightRecorderTrace()
    runs = []
    index = 0
    for seed in seeds:
        for repeat in range(repeats):
            if index and fresh_group is not None:
                fresh_group(index)
            index += 1
            with harness_admitted(_HARNESS):
                trial = executor.open_trial(workload, plan, precision=precision, seed=seed, rank=rank,
                                            world_size=world_size)
                steps = []
                try:
                    for step in range(workload.steps):
                        mark = tracer.mark() if tracer else None
                        phases = PhaseTracker(last_record_id) if tracer is not None else None
                        p2p = point_to_point_trace(phases) if tracer is not None and plan.pp > 1 else None
                        with phases or contextlib.nullcontext(), p2p or contextlib.nullcontext():
                            raw = trial.step(step)
                        if tracer is not None and mark is not None:
                            p2p_entries = [(n, r, phases.resolve(t) if phases and t else t)
                                           for n, r, t in (p2p.entries if p2p is not None else [])]
                            collectives: Any = tracer.since(mark, phases, keep_metadata=True) + p2p_entries
                        else:
                            reported = getattr(trial, "observed_collectives", None)
                            collectives = tuple(reported()) if reported else None
                        issued = getattr(trial, "receipts", None)
                        receipts = receipt_summary(issued()) if callable(issued) and tracer is not None else None
                        # unsharding DTensors (full_tensor) happens here, outside the traced window
                        steps.append({"observables": _observables(raw), "collectives": collectives,
                                      "receipts": receipts})
                finally:
                    trial.close()
            runs.append({"seed": seed, "repeat": repeat, "steps": steps})
    return runs


def gloo_rank_main(rank: int, world_size: int, executor_spec: Any, workload: Any, plan: ParallelPlan,
                   precision: str, seeds: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Entry point of one spawned rank (see ``mesh.run_on_gloo_mesh``)."""
    import logging

    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    # Unsharding observables for comparison (full_tensor) makes DTensor warn about sequential
    # all-gathers on every rank; that cost is the harness's own, not the executor's.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    executor = resolve_executor(executor_spec)
    return run_trials(executor, workload, plan, precision=precision, seeds=seeds, repeats=repeats, rank=rank,
                      world_size=world_size, trace=True, fresh_group=fresh_process_group)
