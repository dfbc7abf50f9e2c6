"""Attribute every traced collective to the declared update that issued it, by kind, axes and phase.

Two declared updates can be realized as the same (collective, axes) on the wire: on gloo FSDP2's
reduce-scatter is recorded as an all-reduce over the same axes as the metric all-reduce, and a
metric all-reduce over the TP group looks like TP's activation all-reduce. Counting entries per
(kind, axes) would let one update's traffic satisfy another's declaration. So each entry carries
the phase it was issued in (``phases.PhaseTracker``), and each payload may only communicate in its
phases (``ALLOWED_PHASES``). Per traced step and rank, every update takes one entry of its own as a
witness, the most constrained update first (fewest allowed phases, then declaration order); the
rest of the entries go to the first update that may take them. An update is observed when it got
a witness in some step; an entry of a declared (kind, axes) in a phase none of its updates allow
(e.g. a gradient all-reduce in a backward before the step's last, on a non-commit micro-step) is
reported against those updates. Self-reported collectives (executors that start their own
workers) carry no phase and may be taken by any update.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from ...contracts import CollectiveKind, DistributedUpdate, ObservedCollective, ParallelPlan, PayloadKind
from .collectives import (
    axes_of_group,
    axis_aliases,
    collective_kind,
    is_metadata,
    realized_kinds,
)

_IN_STEP = frozenset({"forward", "backward_early", "backward"})
ALLOWED_PHASES: dict[PayloadKind, frozenset[str]] = {
    PayloadKind.GRADIENT: frozenset({"backward", "optimizer", "other"}),
    PayloadKind.PARAMETER: frozenset({"forward", "backward_early", "backward", "optimizer", "other"}),
    PayloadKind.ACTIVATION: _IN_STEP,
    PayloadKind.KV_BLOCK: _IN_STEP,
    PayloadKind.TOKEN: _IN_STEP,
    PayloadKind.SUFFICIENT_STATISTIC: frozenset({"optimizer", "other"}),
    PayloadKind.MESSAGE: frozenset({"optimizer", "other"}),
}
"""The step phases (``phases.PHASES``) in which an update of each payload may communicate. Gradients
are reduced in the step's last backward (DDP, FSDP2), after it (hand-written loops, megatron's
finalize) or inside a sharded optimizer's step, never on a non-commit micro-step; parameters are
gathered whenever they are needed; activations, key/value blocks and tokens move while the model
computes; metrics are reduced outside the model's computation."""

_P2P_PHASES = frozenset({"forward", "backward_early", "backward", "other"})

Pair = tuple[CollectiveKind, tuple[Any, ...]]
Aliases = dict[tuple[Any, ...], tuple[Any, ...]]


def _same_axes(axes: tuple[Any, ...], update: DistributedUpdate, aliases: Aliases) -> bool:
    """Whether entries on ``axes`` are on ``update``'s axes (directly, or on ranks an ep/etp group shares)."""
    declared = tuple(sorted(update.mesh_axes))
    return axes == declared or aliases.get(axes) == declared


def allowed_phases(update: DistributedUpdate) -> frozenset[str]:
    """The phases ``update`` may communicate in (point-to-point also between stage computations)."""
    if update.collective is CollectiveKind.P2P:
        return _P2P_PHASES
    return ALLOWED_PHASES.get(update.payload, frozenset({"forward", "backward", "optimizer", "other"}))


@attrs.define
class Attribution:
    """Per update: whether it was witnessed, the entries attributed to it; the entries nobody may take."""

    witnessed: dict[str, bool] = attrs.Factory(dict)
    counts: dict[str, Counter] = attrs.Factory(dict)
    taken_by: dict[Pair, Counter] = attrs.Factory(dict)
    """Per (kind, axes): how many entries each update took (max over ranks)."""
    misplaced: dict[str, list[str]] = attrs.Factory(dict)
    """Per update: entries of its (kind, axes) issued in a phase no update of that pair communicates in."""

    def observed(self, node_id: str) -> list[ObservedCollective]:
        """The collectives attributed to ``node_id`` (counts are per rank, the max over ranks)."""
        return [ObservedCollective(kind, axes, n) for (kind, axes), n in sorted(self.counts.get(node_id, {}).items())]


def step_entries(plan: ParallelPlan, collectives: Any, traced: bool) -> Counter:
    """(kind, sorted axes, phase) -> count for one step's collectives (traced tuples or ObservedCollective)."""
    pool: Counter = Counter()
    for item in collectives:
        if not traced:
            pool[(item.kind, tuple(sorted(item.axes)), None)] += item.count
            continue
        if is_metadata(item):
            continue
        name, ranks, *rest = item
        kind = collective_kind(name)
        if kind is None or len(set(ranks)) < 2:
            continue
        axes = axes_of_group(plan, ranks)
        if axes is None:
            continue  # a stray group: reported as undeclared by the caller
        pool[(kind, tuple(sorted(axes)), rest[0] if rest else None)] += 1
    return pool


def _accepts(update: DistributedUpdate, key: tuple[Any, Any, Any], backend: str, aliases: Aliases) -> bool:
    kind, axes, phase = key
    if kind not in realized_kinds(update.collective, backend) or not _same_axes(axes, update, aliases):
        return False
    return phase is None or phase in allowed_phases(update)


def _assign(pool: Counter, order: Sequence[DistributedUpdate], backend: str, mine: dict[str, Counter],
            witnessed: dict[str, bool], aliases: Aliases) -> Counter:
    """One step's entries to updates (witnesses first); returns the entries no update may take."""
    for update in order:
        for key in sorted(pool, key=str):
            if pool[key] and _accepts(update, key, backend, aliases):
                pool[key] -= 1
                mine[update.node_id][key[:2]] += 1
                witnessed[update.node_id] = True
                break
    left: Counter = Counter()
    for key, n in pool.items():
        taker = next((u for u in order if _accepts(u, key, backend, aliases)), None)
        if taker is not None:
            mine[taker.node_id][key[:2]] += n
        elif n:
            left[key] += n
    return left


def _misplaced_owners(updates: Sequence[DistributedUpdate], key: tuple[Any, Any, Any],
                      backend: str, aliases: Aliases) -> list[DistributedUpdate]:
    kind, axes, phase = key
    same_pair = [u for u in updates if kind in realized_kinds(u.collective, backend)
                 and _same_axes(axes, u, aliases)]
    closest = [u for u in same_pair if str(phase).removesuffix("_early") in allowed_phases(u)]
    return closest or same_pair


def attribute(updates: Sequence[DistributedUpdate], by_rank: list[list[dict[str, Any]]], plan: ParallelPlan,
              *, traced: bool, backend: str, first_step: int = 0) -> Attribution:
    """Attribute repeat 0's traced collectives of every rank and step to ``updates`` (see the module docstring)."""
    talking = [u for u in updates if u.collective is not CollectiveKind.NONE]
    order = sorted(talking, key=lambda u: (len(allowed_phases(u)), talking.index(u)))
    result = Attribution(witnessed={u.node_id: False for u in talking})
    best: dict[str, Counter] = {u.node_id: Counter() for u in talking}
    misplaced: dict[str, Counter] = {}
    aliases = axis_aliases(plan)
    for runs in by_rank:
        mine: dict[str, Counter] = {u.node_id: Counter() for u in talking}
        for run in runs:
            if run["repeat"]:
                continue
            for index, step in enumerate(run["steps"]):
                if step["collectives"] is None:
                    continue
                left = _assign(step_entries(plan, step["collectives"], traced), order, backend, mine,
                               result.witnessed, aliases)
                for key, n in left.items():
                    if index < first_step:
                        continue
                    for owner in _misplaced_owners(talking, key, backend, aliases):
                        found = misplaced.setdefault(owner.node_id, Counter())
                        found[key] = max(found[key], n)
        for node, counts in mine.items():
            for pair, n in counts.items():
                best[node][pair] = max(best[node][pair], n)
    result.counts = best
    for node, counts in best.items():
        for pair, n in counts.items():
            result.taken_by.setdefault(pair, Counter())[node] = n
    for node, keys in misplaced.items():
        result.misplaced[node] = [f"{kind.value} over {[getattr(a, 'value', a) for a in axes]} x{n} in phase "
                                  f"'{phase}'" for (kind, axes, phase), n in sorted(keys.items(), key=str)]
    return result


def unwitnessed_reason(update: DistributedUpdate, result: Attribution, backend: str) -> str:
    """Why ``update`` got no entry of its own: never seen, or every entry of its (kind, axes) was another's."""
    axes = tuple(sorted(update.mesh_axes))
    others = [(pair, takers) for pair, takers in result.taken_by.items()
              if pair[1] == axes and pair[0] in realized_kinds(update.collective, backend)]
    where = f"declared {update.collective.value} over {[a.value for a in update.mesh_axes]}"
    if not others:
        return f"{where} was never observed"
    taken = ", ".join(f"{node} x{n}" for _, takers in others for node, n in sorted(takers.items()) if n)
    return (f"{where} was never observed in its own phases ({', '.join(sorted(allowed_phases(update)))}): "
            f"the {', '.join(sorted({p[0].value for p, _ in others}))} over these axes belonged to {taken}")
