"""A (data parallel x model parallel) worker grid for EM: FLOPs per iteration balanced, memory a hard limit.

An iteration costs ``N * C`` (rows times the per-row work of :func:`compute_cost`). With ``D`` data
replicas of ``M`` model shards each worker does about ``N / D`` rows of ``1 / M`` of the model.
Data parallelism is preferred (no coupling between workers); ``M > 1`` only when memory forces it
(``M >= bytes / smallest memory``) or when there are fewer rows than workers, and the split follows
the work of the axis's units, not their bytes. :func:`auto_balanced_estimator` returns the estimator
when the plan is data parallel and raises ``UnrealizedModelPlacementError`` when it would need the
model's storage split, which this runtime does not execute.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ....contracts.resources import Resources
from .model_decomposition import (
    DecompAxis,
    ModelCut,
    best_parallel_axis,
    compute_cost,
    work_partition,
)
from .planner import UnrealizedModelPlacementError

__all__ = ["BalancePlan", "auto_balanced_estimator", "balance_plan"]


@attrs.frozen(kw_only=True)
class BalancePlan:
    """The chosen grid: ``data_parallel`` x ``model_parallel`` workers, the cut axis and cuts, the
    predicted busiest worker's FLOPs per iteration, whether it fits (None: some memory unknown), why."""

    data_parallel: int
    model_parallel: int
    workers_used: int
    workers_total: int
    axis: DecompAxis
    model_cuts: tuple[ModelCut, ...]
    model_flops: float
    model_bytes: int
    per_worker_flops: float
    fits: bool | None
    rationale: str
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    @property
    def is_model_parallel(self) -> bool:
        """Whether the grid splits the model."""
        return self.model_parallel > 1

    @property
    def workers_idle(self) -> int:
        """Workers the grid leaves unused."""
        return max(0, self.workers_total - self.workers_used)


def _grid(p: int, n_data: int, m_min: int, max_units: int) -> tuple[int, int]:
    """(M, D) keeping the most workers busy, ties to the smaller M, with M >= m_min where the axis allows."""
    m_lo = max(1, min(m_min, max_units, p))
    best = (m_lo, max(1, min(n_data, p // m_lo)))
    for m in range(m_lo, min(max_units, p) + 1):
        d = min(n_data, p // m)
        if d >= 1 and m * d > best[0] * best[1]:
            best = (m, d)
    return best


def balance_plan(model: Any, resources: Resources, *, n_data: int) -> BalancePlan:
    """The grid that balances FLOPs per iteration over ``resources`` with memory as a hard constraint."""
    if isinstance(n_data, bool) or not isinstance(n_data, int) or n_data < 1:
        raise ValueError(f"n_data must be an int >= 1 (rows of the data), got {n_data!r}")
    devices = tuple(resources.devices)
    p = len(devices)
    flops, model_bytes = compute_cost(model)
    best = best_parallel_axis(model, p)
    max_units = best.num_units if best is not None else 1
    memories = [d.memory_bytes for d in devices if d.memory_bytes is not None]
    smallest = min(memories) if memories else None
    m_mem = math.ceil(model_bytes / smallest) if smallest and model_bytes > smallest else 1
    m, d = _grid(p, n_data, m_mem, max_units)
    cut_works, cut_bytes = [flops], [model_bytes]
    cuts: tuple[ModelCut, ...] = ()
    axis = DecompAxis.NONE
    if m > 1 and best is not None:
        counts = work_partition(best.unit_works, (1.0,) * m)
        fixed_w, fixed_b = max(0.0, flops - best.total_work), max(0, model_bytes - sum(best.unit_bytes))
        axis, start, out = best.axis, 0, []
        cut_works, cut_bytes = [], []
        for dev, c in zip(devices, counts):
            out.append(ModelCut(dev, start, start + c, best.reduction))
            cut_works.append(fixed_w + sum(best.unit_works[start:start + c]))
            cut_bytes.append(fixed_b + sum(best.unit_bytes[start:start + c]))
            start += c
        cuts, m = tuple(out), len(out)
    used = m * d
    rows = math.ceil(n_data / d)
    fits: bool | None = True
    for i, dev in enumerate(devices[:used]):
        need = cut_bytes[i % len(cut_bytes)]
        if dev.memory_bytes is None:
            fits = None if fits else fits
        elif need > dev.memory_bytes:
            fits = False
            break
    why = _rationale(m, d, used, p, n_data, max_units)
    if fits is False:
        why += f" [WARNING: does not fit: it needs {m_mem} shard(s) for memory, its best axis offers {max_units}]"
    elif fits is None:
        why += " [memory fit unknown: some device has no memory figure]"
    return BalancePlan(
        data_parallel=d, model_parallel=m, workers_used=used, workers_total=p, axis=axis, model_cuts=cuts,
        model_flops=flops, model_bytes=model_bytes, per_worker_flops=rows * max(cut_works), fits=fits, rationale=why,
        extra={"max_units": max_units, "m_mem": m_mem, "best_axis": None if best is None else best.path,
               "rows_per_data_replica": rows, "per_cut_flops": tuple(cut_works), "per_cut_bytes": tuple(cut_bytes)})


def _rationale(m: int, d: int, used: int, p: int, n_data: int, max_units: int) -> str:
    if used < p and m == 1 and max_units <= 1 and n_data < p:
        return (f"{used} of {p} workers: {n_data} row(s) cannot fill the workers and the model has no splittable axis; "
                "it needs a structured decomposition (a mixture or composite) to use more")
    if m == 1:
        return f"data-parallel: the model fits and {n_data} rows fill {d} of {p} workers"
    if d == 1:
        return f"model-parallel x{m}: {n_data} row(s) cannot fill the workers, the model is split {m} ways"
    return f"grid {d} x {m} = {used} of {p} workers: the model split {m} ways, the data {d} ways"


def auto_balanced_estimator(estimator: Any, model: Any, resources: Resources | None = None, *,
                            n_data: int) -> tuple[Any, BalancePlan]:
    """``(estimator, plan)`` for a data-parallel plan; ``UnrealizedModelPlacementError`` (with this
    ``BalancePlan`` as ``.plan``) for one that splits the model (this runtime keeps the whole model in
    every worker)."""
    resources = Resources.local() if resources is None else resources
    plan = balance_plan(model, resources, n_data=n_data)
    if plan.is_model_parallel:
        raise UnrealizedModelPlacementError(plan)  # .plan is this BalancePlan, as in mixle 0.8.2
    return estimator, plan
