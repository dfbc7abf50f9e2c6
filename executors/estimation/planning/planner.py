"""Planner: advisory row placement by device throughput and component-axis model sharding.

Memory is counted per device over everything resident on it: its rows of encoded data, a full
copy of the model, and the working memory of one chunk's E-step (a K x chunk-rows score matrix
and its temporaries). Data parallelism never needs the responsibilities of all rows at once, so
a plain estimator serves whenever one copy of the model fits on every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ....contracts.placement import ComponentShard, ModelShardingPlan, Placement, RowShard
from ....contracts.resources import Resources
from ..em_pass.chunks import chunk_bounds, resolve_encoder
from ..em_pass.engine_choice import resolve_engine
from ..options import sub_chunked
from .model_decomposition import ModelDecomposition, decompose_model

__all__ = ["UnrealizedModelPlacementError", "auto_parallel_estimator", "model_sharding_plan", "plan"]

WORK_ARRAYS = 3
"""Float64 K x rows temporaries alive at once in a mixture E-step (scores, exp, responsibilities)."""


class UnrealizedModelPlacementError(RuntimeError):
    """The planner would split model storage across devices, which this runtime cannot execute.

    ``plan`` is the decision that asked for the split: a ``ModelDecomposition`` from
    :func:`auto_parallel_estimator`, the ``BalancePlan`` from ``auto_balanced_estimator`` (both as in
    mixle 0.8.2), or a ``ModelShardingPlan``.
    """

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        if isinstance(plan, ModelShardingPlan):
            what = (f"the model ({plan.model_bytes} bytes, {plan.num_components} components) does not fit on "
                    f"every device, so the plan splits its components: {plan.reason}")
        elif hasattr(plan, "model_parallel"):  # a BalancePlan
            what = (f"the balance plan splits its components ({getattr(plan.axis, 'value', plan.axis)}) "
                    f"{plan.model_parallel} ways over {plan.workers_used} of {plan.workers_total} workers: "
                    f"{plan.rationale}")
        else:
            what = (f"the planner cuts the model along {getattr(plan.axis, 'value', plan.axis)} into "
                    f"{len(plan.cuts)} shards: {plan.rationale}")
        super().__init__(
            f"{what}. This runtime keeps the full model resident in each process: fit data parallel with the "
            "plain estimator, or thread its components with ComponentParallelEstimator, where one copy fits a "
            "device; otherwise add memory per device or shrink the model"
        )


def _nbytes(value: Any) -> int:
    """Bytes of the arrays and scalars in a plain-data tree (strings and others by length)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(k) + _nbytes(v) for k, v in value.items())
    if isinstance(value, (str, bytes)):
        return len(value)
    return 8


def _model_bytes(model: Any) -> int:
    if model is None:
        return 0
    params = getattr(model, "params", None)
    return _nbytes(params()) if callable(params) else 0


def _num_components(model: Any, estimator: Any) -> int:
    for obj, attr in (
        (model, "components"),
        (estimator, "estimators"),
        (getattr(estimator, "inner", None), "estimators"),
    ):
        if obj is not None and hasattr(obj, attr):
            return max(1, len(getattr(obj, attr)))
    return 1


def plan(
    data: Any = None,
    model: Any = None,
    estimator: Any = None,
    encoder: Any = None,
    resources: Resources | None = None,
    engine: Any = None,
    precision: Any = None,
    num_chunks: int | None = None,
    sub_chunks: int = 1,
    sample_size: int = 256,
    safety_factor: float = 1.25,
) -> Placement:
    """An advisory placement: whole chunks to devices in proportion to their throughput (mixle's signature).

    The chunks are the handle's (``num_chunks`` and ``sub_chunks`` as ``encoded_data`` cuts them).
    Per device the bytes resident count its rows of encoded data, a full model copy and one chunk's
    E-step working memory, whose element size follows ``engine``/``precision`` (8 bytes on the numpy
    engine, which computes in float64 only; 4 for ``engine="torch", precision="fp32"``).
    """
    if isinstance(sub_chunks, bool) or not isinstance(sub_chunks, int) or sub_chunks < 1:
        raise ValueError(f"sub_chunks must be an int >= 1, got {sub_chunks!r}")
    n = 0 if data is None else len(data)
    count, _ = sub_chunked(n, num_chunks, None, sub_chunks)
    bounds = chunk_bounds(n, num_chunks=count)
    return placement_for_bounds(bounds, data, model=model, estimator=estimator, encoder=encoder,
                                resources=resources, element_bytes=element_bytes(engine, precision),
                                sample_size=sample_size, safety_factor=safety_factor)


def element_bytes(engine: Any, precision: Any) -> int:
    """Bytes of one working-memory element of the E-step on ``engine`` at ``precision`` (refused if it cannot)."""
    choice = resolve_engine(engine, precision)
    if choice is None:
        text = getattr(precision, "__name__", None) or str(precision)
        if precision is not None and text.lower() not in ("fp64", "float64", "double"):
            raise ValueError(f"precision={precision!r}: the numpy engine computes in float64 only; drop precision=, "
                             "pass 'fp64', or plan for engine='torch' (which also computes in 'fp32')")
        return 8
    return 4 if choice.precision == "fp32" else 8


def placement_for_bounds(bounds: Sequence[tuple[int, int]], data: Any, *, model: Any = None, estimator: Any = None,
                         encoder: Any = None, resources: Resources | None = None, element_bytes: int = 8,
                         sample_size: int = 256, safety_factor: float = 1.25) -> Placement:
    """The placement of these chunk ``bounds`` over ``resources``: whole chunks to devices by throughput."""
    if resources is None:
        resources = Resources.local()
    if safety_factor < 1.0:
        raise ValueError(f"safety_factor must be >= 1, got {safety_factor}")
    n = bounds[-1][1] if bounds else 0
    bytes_per_row = 0
    if n:
        enc = resolve_encoder(estimator, model, encoder)
        sample = data[: max(1, min(sample_size, n))]
        bytes_per_row = max(1, -(-_nbytes(enc.encode(sample)) // len(sample)))
    k = _num_components(model, estimator)
    model_bytes = _model_bytes(model)
    devices = list(resources.devices)
    total = resources.total_throughput
    shards, notes, fits = [], [], True
    cum, first = 0.0, 0
    for j, dev in enumerate(devices):
        cum += dev.throughput
        last = len(bounds) if j == len(devices) - 1 else int(round(len(bounds) * cum / total))
        last = max(first, min(last, len(bounds)))
        start = bounds[first][0] if first < len(bounds) else n
        stop = bounds[last - 1][1] if last > first else start
        rows_per_chunk = max((b - a for a, b in bounds[first:last]), default=0)
        work = WORK_ARRAYS * element_bytes * k * rows_per_chunk
        resident = int(safety_factor * ((stop - start) * bytes_per_row + model_bytes + work))
        if dev.memory_bytes is not None and resident > dev.memory_bytes:
            fits = False
            notes.append(f"{dev.name}: needs {resident} bytes resident, has {dev.memory_bytes}")
        shards.append(RowShard(dev.name, start, stop, first, last, resident))
        first = last
    return Placement(n, len(bounds), bytes_per_row, model_bytes, tuple(shards), fits, tuple(notes))


def model_sharding_plan(
    model: Any,
    resources: Resources,
    estimator: Any = None,
    axis: str = "components",
    min_components_per_shard: int = 1,
) -> ModelShardingPlan:
    """Replicate the model when one copy fits on every device; else split components by memory."""
    if axis != "components":
        raise ValueError(f"only the 'components' axis can be planned, got {axis!r}")
    if min_components_per_shard < 1:
        raise ValueError(f"min_components_per_shard must be >= 1, got {min_components_per_shard}")
    k = _num_components(model, estimator)
    model_bytes = _model_bytes(model)
    per_component = -(-model_bytes // k) if model_bytes else 0
    caps = [d.memory_bytes for d in resources.devices]
    if all(c is None or c >= model_bytes for c in caps):
        shards = tuple(ComponentShard(d.name, 0, k, model_bytes) for d in resources.devices)
        return ModelShardingPlan(
            axis,
            k,
            model_bytes,
            shards,
            False,
            True,
            "one copy of the model fits on every device: replicate it, split the data",
        )
    # Split components in proportion to memory, at least min_components_per_shard each.
    usable = [  # (device, its memory)
        (d, d.memory_bytes)
        for d in resources.devices
        if d.memory_bytes and d.memory_bytes >= per_component * min_components_per_shard
    ]
    capacity = sum(memory // max(per_component, 1) for _, memory in usable)
    shards_list, start = [], 0
    for d, memory in usable:
        if start >= k:
            break
        take = max(min_components_per_shard, int(memory // max(per_component, 1)))
        stop = min(k, start + take)
        shards_list.append(ComponentShard(d.name, start, stop, (stop - start) * per_component))
        start = stop
    fits = start >= k and capacity >= k
    if not shards_list:
        shards_list = [ComponentShard(resources.devices[0].name, 0, k, model_bytes)]
    reason = (
        f"the model needs {model_bytes} bytes but the smallest device holds "
        f"{min(c for c in caps if c is not None)}; components split over {len(shards_list)} device(s)"
    )
    return ModelShardingPlan(axis, k, model_bytes, tuple(shards_list), True, fits, reason)


def auto_parallel_estimator(
    estimator: Any,
    model: Any,
    resources: Resources | None = None,
    *,
    n_data: int | None = None,
    min_components_per_shard: int = 1,
) -> tuple[Any, ModelDecomposition]:
    """``(estimator, decision)``: the caller's estimator unchanged and ``decompose_model``'s decision.

    mixle 0.8.2's rule: data parallel (the model replicated) when nothing is worth cutting or there
    is one device, or when the model fits replicated, the best axis has fewer than 2 x devices units
    and ``n_data`` is None or at least 8 x devices rows. Otherwise the decision is model parallel
    and ``UnrealizedModelPlacementError`` is raised with it as ``.plan``: this runtime keeps the whole
    model in every process.
    """
    if resources is None:
        resources = Resources.local()
    if n_data is not None and (isinstance(n_data, bool) or not isinstance(n_data, int) or n_data < 0):
        raise ValueError(f"n_data must be an int >= 0 (the rows to fit) or None, got {n_data!r}")
    decision = decompose_model(model, resources, n_data=n_data, min_components_per_shard=min_components_per_shard)
    if decision.is_model_parallel:
        raise UnrealizedModelPlacementError(decision)
    return estimator, decision
