"""Count the collectives a rank really issued (PyTorch's flight recorder) and name their mesh axes.

The flight recorder (``TORCH_FR_BUFFER_SIZE`` > 0 before the process group starts) logs every
collective a c10d process group runs, including those issued from C++ (the DDP reducer) and
by functional collectives (DTensor). ``FlightRecorderTrace`` snapshots it around a step; the
process-group name of each entry is mapped to its global ranks, and ``axes_of_group`` maps
ranks to the plan axes whose process group they are.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ...contracts import (
    PHYSICAL_AXES,
    CollectiveKind,
    ObservedCollective,
    ParallelAxis,
    ParallelPlan,
)

# flight-recorder profiling names -> collective kinds (substring match, gloo and nccl spellings)
_KIND_PATTERNS: tuple[tuple[str, CollectiveKind | None], ...] = (
    ("reduce_scatter", CollectiveKind.REDUCE_SCATTER),
    ("allgather", CollectiveKind.ALL_GATHER),
    ("all_gather", CollectiveKind.ALL_GATHER),
    ("allreduce", CollectiveKind.ALL_REDUCE),
    ("all_reduce", CollectiveKind.ALL_REDUCE),
    ("alltoall", CollectiveKind.ALL_TO_ALL),
    ("all_to_all", CollectiveKind.ALL_TO_ALL),
    ("broadcast", CollectiveKind.BROADCAST),
    ("send", CollectiveKind.P2P),
    ("recv", CollectiveKind.P2P),
    ("barrier", None),
)


_DATA_DTYPES = frozenset({"Float", "Double", "Half", "BFloat16", "ComplexFloat", "ComplexDouble",
                          "Float8_e4m3fn", "Float8_e5m2"})
_DTYPE_BYTES = {"Float": 4, "Double": 8, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4, "Byte": 1, "Bool": 1,
                "Char": 1, "Short": 2, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def entry_bytes(entry: dict[str, Any], group_size: int) -> int:
    """Bytes a flight-recorder entry moved per rank, by the receipts' definition: the buffer of an all-reduce,
    broadcast or reduce-scatter input, the gathered output of an all-gather (gloo records one input slot)."""
    sizes, dtypes = entry.get("input_sizes", []), entry.get("input_dtypes", [])
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * _DTYPE_BYTES.get(str(dtype), 0)
    if collective_kind(str(entry.get("profiling_name", ""))) is CollectiveKind.ALL_GATHER:
        total *= max(group_size, 1)
    return total


GLOO_REALIZATIONS: dict[CollectiveKind, CollectiveKind] = {CollectiveKind.REDUCE_SCATTER: CollectiveKind.ALL_REDUCE}
"""How gloo really runs a collective: ProcessGroupGloo has no native reduce-scatter and records
``reduce_scatter_tensor`` as ``gloo:all_reduce`` (checked on torch 2.13), so on a gloo mesh a declared
reduce-scatter is matched by an all-reduce over the same axes."""


def realized_kinds(kind: CollectiveKind, backend: str = "gloo") -> tuple[CollectiveKind, ...]:
    """The kinds a declared collective may be recorded as on ``backend``."""
    if backend == "gloo" and kind in GLOO_REALIZATIONS:
        return (kind, GLOO_REALIZATIONS[kind])
    return (kind,)


def collective_kind(profiling_name: str) -> CollectiveKind | None:
    """The CollectiveKind of a flight-recorder entry (None for a barrier); CUSTOM when unknown."""
    name = profiling_name.split(":", 1)[-1].lower()
    for pattern, kind in _KIND_PATTERNS:
        if pattern in name:
            return kind
    return CollectiveKind.CUSTOM


def _dump() -> list[dict[str, Any]]:
    import torch._C._distributed_c10d as c10d

    dump = c10d._dump_fr_trace_json  # type: ignore[attr-defined]  # private: torch ships no stub for it
    return list(json.loads(dump()).get("entries", []))


def group_ranks_by_name() -> dict[str, tuple[int, ...]]:
    """Every live process group's name -> its global ranks (this process's view)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    names = {}
    for group, name in c10d._world.pg_names.items():
        try:
            names[str(name)] = tuple(sorted(dist.get_process_group_ranks(group)))
        except (RuntimeError, ValueError):  # a group this rank is not part of
            continue
    return names


class FlightRecorderTrace:
    """Snapshots of the flight recorder; ``since(mark)`` lists the collectives issued after a mark."""

    def __init__(self) -> None:
        import os

        if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0:
            raise RuntimeError(
                "collective tracing needs TORCH_FR_BUFFER_SIZE > 0 before the process group starts "
                "(the verification mesh sets it)"
            )

    def mark(self) -> set[int]:
        """Record ids of every entry recorded so far (unique per process)."""
        return {int(e["record_id"]) for e in _dump()}

    def since(self, mark: set[int], phases: Any = None, *, keep_metadata: bool = False) -> list[tuple[Any, ...]]:
        """(profiling name, global ranks of its group, phase, bytes, metadata) per entry recorded after ``mark``.

        ``phases`` (a ``phases.PhaseTracker``) names the step phase each entry was issued in (None
        without one). Broadcasts of integer tensors only are metadata (DDP's bucket-order sync after
        its first iteration), not an update's data: left out, or kept with ``metadata=True`` when
        ``keep_metadata`` (receipts may count an integer buffer broadcast; see ``receipts``).
        """
        groups = group_ranks_by_name()
        out = []
        for entry in _dump():
            record_id = int(entry["record_id"])
            if record_id in mark:
                continue
            profiling = str(entry["profiling_name"])
            dtypes = [str(d) for d in entry.get("input_dtypes", [])]
            metadata = collective_kind(profiling) is CollectiveKind.BROADCAST and bool(dtypes) and not any(
                d in _DATA_DTYPES for d in dtypes)
            if metadata and not keep_metadata:
                continue
            phase = phases.phase_of(record_id) if phases is not None else None
            ranks = groups.get(str(entry["process_group"][0]), ())
            out.append((profiling, ranks, phase, entry_bytes(entry, len(ranks)), metadata))
        return out


def is_metadata(entry: tuple[Any, ...]) -> bool:
    """True for a traced entry ``since(keep_metadata=True)`` flagged as an integer-only broadcast."""
    return len(entry) > 4 and bool(entry[4])


def last_record_id() -> int:
    """The flight recorder's newest record id in this process (-1 when it holds none)."""
    return max((int(e["record_id"]) for e in _dump()), default=-1)


def _physical_groups(plan: ParallelPlan, axes: tuple[ParallelAxis, ...]) -> set[frozenset[int]]:
    groups: dict[tuple[int, ...], set[int]] = {}
    for rank in range(plan.world_size):
        coord = plan.coordinate(rank)
        key = tuple(coord[a] for a in PHYSICAL_AXES if a not in axes)
        groups.setdefault(key, set()).add(rank)
    return {frozenset(g) for g in groups.values()}


def axes_of_group(plan: ParallelPlan, ranks: Iterable[int]) -> tuple[ParallelAxis, ...] | None:
    """The plan axes whose process group is exactly ``ranks`` (smallest set, mesh order); None if none."""
    members = frozenset(ranks)
    if len(members) < 2:
        return ()
    active = [a for a in PHYSICAL_AXES if plan.size(a) > 1]
    for size in range(1, len(active) + 1):
        for combo in itertools.combinations(active, size):
            if members in _physical_groups(plan, combo):
                return combo
    for axis in (ParallelAxis.EP, ParallelAxis.ETP):
        if plan.size(axis) > 1 and members in {frozenset(g) for g in plan.axis_group_ranks(axis)}:
            return (axis,)
    return None


def coinciding_axes(plan: ParallelPlan) -> dict[tuple[ParallelAxis, ...], tuple[ParallelAxis, ...]]:
    """Physical axis sets whose process groups are exactly the groups of an overlapping axis (ep, etp).

    On such a plan (dp_replicate=2, ep=2 on two ranks) a collective on the shared ranks is on both
    axes at once; ``axes_of_group`` names the physical one, and this says which overlapping axis it
    also is, so a collective declared on that axis can be matched (``realign``)."""
    found: dict[tuple[ParallelAxis, ...], tuple[ParallelAxis, ...]] = {}
    active = [a for a in PHYSICAL_AXES if plan.size(a) > 1]
    for axis in (ParallelAxis.EP, ParallelAxis.ETP):
        if plan.size(axis) < 2:
            continue
        groups = {frozenset(g) for g in plan.axis_group_ranks(axis)}
        for size in range(1, len(active) + 1):
            for combo in itertools.combinations(active, size):
                if combo not in found and _physical_groups(plan, combo) == groups:
                    found[combo] = (axis,)
    return found


def axis_aliases(plan: ParallelPlan) -> dict[tuple[ParallelAxis, ...], tuple[ParallelAxis, ...]]:
    """Sorted physical axes -> the sorted overlapping axes (ep, etp) whose groups are the same ranks."""
    return {tuple(sorted(k)): tuple(sorted(v)) for k, v in coinciding_axes(plan).items()}


def realign(plan: ParallelPlan, counts: Counter, declared: set[tuple[CollectiveKind, tuple[ParallelAxis, ...]]],
            ) -> Counter:
    """``counts`` keyed by (kind, sorted axes) with a pair that is not declared, but whose groups are also an
    overlapping axis's on which that kind is declared, moved to that axis (see ``coinciding_axes``)."""
    aliases = axis_aliases(plan)
    out: Counter = Counter()
    for (kind, axes), n in counts.items():
        alias = aliases.get(axes)
        moved = (kind, axes) not in declared and alias is not None and (kind, alias) in declared
        out[(kind, alias) if moved else (kind, axes)] += n
    return out


def summarize(plan: ParallelPlan, entries: Iterable[tuple[Any, ...]]) -> tuple[
        tuple[ObservedCollective, ...], tuple[str, ...]]:
    """Count entries ``(profiling name, ranks[, phase])`` by (kind, axes); entries on groups that match no
    axis are returned as text."""
    counts: Counter[tuple[CollectiveKind, tuple[ParallelAxis, ...]]] = Counter()
    strays: Counter[str] = Counter()
    for entry in entries:
        if is_metadata(entry):
            continue
        profiling_name, ranks = entry[0], entry[1]
        kind = collective_kind(profiling_name)
        if kind is None or len(set(ranks)) < 2:
            continue  # barriers and single-rank groups move no data between ranks
        axes = axes_of_group(plan, ranks)
        if axes is None:
            strays[f"{kind.value} over ranks {list(ranks)} (not the group of any axis of {plan.describe()})"] += 1
        else:
            counts[(kind, axes)] += 1
    observed = tuple(ObservedCollective(kind, axes, n) for (kind, axes), n in sorted(counts.items()))
    return observed, tuple(f"{text} x{n}" for text, n in sorted(strays.items()))


class PointToPointTrace:
    """Records each ``torch.distributed`` send/recv (isend/irecv too) with its group's global ranks.

    gloo's flight recorder logs collectives but not point-to-point ops (checked on torch 2.13: a
    megatron pp=2 step records only its all-reduces), and ProcessGroup.send/recv do not pass the
    dispatcher, so while active this wraps the four functions at the ``torch.distributed`` API
    (the module and ``distributed_c10d``, so ``P2POp``'s own check still accepts them).
    """

    NAMES = ("send", "recv", "isend", "irecv")

    def __init__(self, phases: Any = None) -> None:
        self.entries: list[tuple[str, tuple[int, ...], str | None]] = []
        self._phases = phases
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, name: str, original: Any) -> Any:
        import torch.distributed as dist

        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            ranks = tuple(sorted(dist.get_process_group_ranks(group or dist.group.WORLD)))
            phase = self._phases.current() if self._phases is not None else None
            self.entries.append((f"api:{name}", ranks, phase))
            return original(tensor, *args, **kwargs)

        return counted

    def __enter__(self) -> PointToPointTrace:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name in self.NAMES:
            wrapped = self._wrap(name, getattr(c10d, name))
            for module in (dist, c10d):
                self._saved.append((module, name, getattr(module, name)))
                setattr(module, name, wrapped)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()


def point_to_point_trace(phases: Any = None) -> PointToPointTrace:
    """A fresh ``PointToPointTrace`` (use as a context manager around one step; ``phases`` names each call's phase)."""
    return PointToPointTrace(phases)
