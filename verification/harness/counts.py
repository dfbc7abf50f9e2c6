"""The collective count of each declared update, observed per step, against the count the executor declares.

An executor that starts its own workers (``SelfLaunch``: the EM backends) reports per step what it
handed to its transport (``trial.observed_collectives()``, counted at the transport, never derived
from the worker count); one that also declares ``collectives_per_step(plan) -> {node_id: count}``
is held to it: a step whose observed count for that update's (collective, axes) differs is a
``collectives`` failure naming both numbers, so a backend that sends extra or fewer messages than it
declares is refused with its real count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...contracts import DistributedUpdate, ParallelPlan
from .collectives import realized_kinds
from .launch import ByRank

__all__ = ["count_mismatches", "declared_counts"]


def declared_counts(executor: Any, plan: ParallelPlan) -> dict[str, int]:
    """The executor's ``collectives_per_step(plan)`` ({node_id: count}), or {} when it declares none."""
    declare = getattr(executor, "collectives_per_step", None)
    if not callable(declare):
        return {}
    counts = dict(declare(plan))
    for node, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{type(executor).__name__}.collectives_per_step({plan.describe()}) gives {count!r} for "
                             f"{node!r}; expected a count >= 0")
    return counts


def _step_count(update: DistributedUpdate, found: Any, backend: str) -> int:
    kinds = realized_kinds(update.collective, backend)
    axes = tuple(sorted(update.mesh_axes))
    return sum(int(item.count) for item in found or () if item.kind in kinds and tuple(sorted(item.axes)) == axes)


def count_mismatches(updates: tuple[DistributedUpdate, ...], by_rank: ByRank, declared: Mapping[str, int],
                     backend: str) -> dict[str, list[str]]:
    """Per update with a declared count, every step (rank, seed, repeat) whose observed count differs."""
    found: dict[str, list[str]] = {}
    for update in updates:
        expected = declared.get(update.node_id)
        if expected is None:
            continue
        for rank, runs in enumerate(by_rank):
            for run in runs:
                for step, record in enumerate(run["steps"]):
                    if record["collectives"] is None:
                        continue  # reported nothing at all: the 'collectives' check names that already
                    seen = _step_count(update, record["collectives"], backend)
                    if seen != expected:
                        found.setdefault(update.node_id, []).append(
                            f"step {step} (rank {rank}, seed {run['seed']}, repeat {run['repeat']}) handed "
                            f"{seen} {update.collective.value} message(s) over {[a.value for a in update.mesh_axes]} "
                            f"to its transport, the executor declares {expected} per step")
    return found
