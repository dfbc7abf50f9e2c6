"""The accumulation window every data-parallel certification measures.

A data-parallel plan runs two code paths per step that a window of one call never reaches: the
non-commit calls of gradient accumulation (gradients stay local, no reduction) and the split of a
call into micro-batches. ``measured_window(plan, workload)`` is the plan and workload the harness
really runs: a training plan with data parallelism gets ``gradient_accumulation_steps >= 2`` and
``microbatches >= 2`` (the sizes it asks for when larger), and a built-in workload's global batch
grows to a multiple of ``data_parallel_size * gradient_accumulation_steps * microbatches`` so every
call and micro-batch holds rows. The certificate records that plan as ``measured_plan``; the gate
(``contracts.window_covers``) admits a plan's window only when the measured one covers it.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...contracts import ParallelPlan

__all__ = ["MEASURED_WINDOW", "measured_window"]

MEASURED_WINDOW = 2
"""The smallest accumulation window (calls, and micro-batches per call) a data-parallel certification runs."""


def _is_training(workload: Any) -> bool:
    return hasattr(workload, "build_module")


def measured_window(plan: ParallelPlan, workload: Any) -> tuple[ParallelPlan, Any]:
    """The (plan, workload) the harness runs for ``plan``: widened to an accumulation window when data-parallel."""
    if not _is_training(workload) or plan.data_parallel_size < 2:
        return plan, workload
    widened = attrs.evolve(plan, gradient_accumulation_steps=max(plan.gradient_accumulation_steps, MEASURED_WINDOW),
                           microbatches=max(plan.microbatches, MEASURED_WINDOW))
    rows = widened.data_parallel_size * widened.gradient_accumulation_steps * widened.microbatches
    batch = getattr(workload, "batch", None)
    if attrs.has(type(workload)) and isinstance(batch, int) and batch % rows:
        workload = attrs.evolve(workload, batch=-(-batch // rows) * rows)
    return widened, workload
