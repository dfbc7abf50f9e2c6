"""Structural sizing and model-parallel cuts of any model tree, through a declared decomposition contract.

A node says how it splits by declaring a :class:`Decomposition` -- its own method
``decomposition()`` or one registered for its type with :func:`register_decomposition` (the
built-in mixture and composite are registered here) -- naming the axis, the children split along it
(``units``), other nested models it owns (``owned``), and its *own* numeric parameters. A node that
declares nothing is a leaf whose own parameters are its ``params()``. Nothing walks ``__dict__``.

From that: :func:`compute_cost` (a per-row FLOP proxy and the bytes), :func:`size_model_tree`,
:func:`tree_axes` (every splittable axis anywhere in the tree, with per-unit work),
:func:`best_parallel_axis` and :func:`decompose_model` (contiguous unit ranges balanced by work and
device throughput). Shared subtrees are counted once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from ....contracts.resources import DeviceSpec, Resources
from ..compat.mixle_decomposition import is_mixle_decomposition, view_mixle_node
from ..models import CompositeDistribution, MixtureDistribution

__all__ = [
    "AxisCandidate", "DecompAxis", "Decomposition", "ModelCut", "ModelDecomposition", "NodeSize", "ReductionOp",
    "best_parallel_axis", "compute_cost", "cost_children", "decompose_model", "decomposition_of",
    "has_declared_decomposition", "register_decomposition", "shard_children", "size_model_tree", "subtree_work",
    "tree_axes",
]


class _MixleComparable(enum.Enum):
    """An enum member equal to mixle's member of the same enum name and value (so mixle code compares them)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, enum.Enum) and not isinstance(other, type(self)):
            return type(other).__name__ == type(self).__name__ and other.value == self.value
        return self is other

    def __hash__(self) -> int:
        return hash(self._name_)

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, enum.Enum) and type(value).__name__ == cls.__name__:
            return cls(value.value)
        return None


class DecompAxis(_MixleComparable):
    """The dimension a node splits along (mixle's values; equal to mixle's members)."""

    NONE = "none"
    COMPONENT = "component"
    FACTOR = "factor"
    SEQUENCE = "sequence"
    TOPIC = "topic"
    STATE = "state"


class ReductionOp(_MixleComparable):
    """How per-shard statistics recombine across a cut (mixle's values; equal to mixle's members)."""

    SUM = "sum"
    LOGSUMEXP_RESPONSIBILITY = "logsumexp"
    REPLICATE = "replicate"


def _items(values: Any) -> tuple[Any, ...]:
    return tuple(values)


def _names(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


@attrs.frozen(kw_only=True)
class Decomposition:
    """What a node declares: axis and reduction, the ``units`` split along the axis (with ``roles``),
    other ``owned`` nested models (costed, not split), and its own numeric ``params``."""

    axis: DecompAxis = DecompAxis.NONE
    reduction: ReductionOp = ReductionOp.REPLICATE
    units: tuple[Any, ...] = attrs.field(default=(), converter=_items)
    roles: tuple[str, ...] = attrs.field(default=(), converter=_names)
    owned: tuple[Any, ...] = attrs.field(default=(), converter=_items)
    params: Any = ()

    def __attrs_post_init__(self) -> None:
        if self.roles and len(self.roles) != len(self.units):
            raise ValueError(f"Decomposition has {len(self.units)} units but {len(self.roles)} roles")
        if self.axis is DecompAxis.NONE and self.units:
            raise ValueError("an atomic Decomposition (axis NONE) has no units; list nested models as owned=")

    @property
    def num_units(self) -> int:
        """Units along the axis (1 for an atomic node)."""
        return len(self.units) if self.units else 1

    @property
    def is_shardable(self) -> bool:
        """Whether the node can be split (an axis with two units or more)."""
        return self.axis is not DecompAxis.NONE and len(self.units) >= 2

    def role(self, i: int) -> str:
        """The name of unit ``i`` in paths."""
        return self.roles[i] if self.roles else f"{self.axis.value}_{i}"


_REGISTRY: dict[type, Callable[[Any], Decomposition]] = {}


def register_decomposition(cls: type, declare: Callable[[Any], Decomposition]) -> None:
    """Declare how instances of ``cls`` decompose (for types whose source you do not own)."""
    if not isinstance(cls, type) or not callable(declare):
        raise TypeError("register_decomposition(cls, declare): a class and a function node -> Decomposition")
    _REGISTRY[cls] = declare


def has_declared_decomposition(node: Any) -> bool:
    """True when ``node`` declares its structure: ``decomposition()``, a registered one, or ``params()``."""
    return (callable(getattr(node, "decomposition", None)) or any(isinstance(node, cls) for cls in _REGISTRY)
            or callable(getattr(node, "params", None)))


def decomposition_of(node: Any) -> Decomposition:
    """The node's declared decomposition: its ``decomposition()``, a registered one, else a leaf of ``params()``."""
    method = getattr(node, "decomposition", None)
    if callable(method):
        found = method()
    else:
        declare = next((d for cls, d in _REGISTRY.items() if isinstance(node, cls)), None)
        if declare is not None:
            found = declare(node)
        else:
            params = getattr(node, "params", None)
            return Decomposition(params=params() if callable(params) else ())
    if isinstance(found, Decomposition):
        return found
    if is_mixle_decomposition(found):
        return _from_mixle(node, found)
    raise TypeError(f"{type(node).__name__}.decomposition() returned {type(found).__name__}, not a Decomposition: "
                    "it must return a mixle_parallel Decomposition (or mixle's mixle.stats.compute.decomposition one)")


def _from_mixle(node: Any, found: Any) -> Decomposition:
    """Our Decomposition of a node that declared mixle's (children and parameters per mixle's family table)."""
    view = view_mixle_node(node, found)
    try:
        axis, reduction = DecompAxis(view.axis), ReductionOp(view.reduction)
    except ValueError as exc:
        raise TypeError(f"{type(node).__name__}.decomposition(): {exc}; the axes understood are "
                        f"{[a.value for a in DecompAxis]}, the reductions {[r.value for r in ReductionOp]}") from None
    return Decomposition(axis=axis, reduction=reduction, units=view.units, roles=view.roles, owned=view.owned,
                         params=view.params)


register_decomposition(MixtureDistribution, lambda m: Decomposition(
    axis=DecompAxis.COMPONENT, reduction=ReductionOp.LOGSUMEXP_RESPONSIBILITY, units=m.components,
    roles=tuple(f"component_{i}" for i in range(len(m.components))), params=(m.weights, m.log_weights)))
register_decomposition(CompositeDistribution, lambda c: Decomposition(
    axis=DecompAxis.FACTOR, reduction=ReductionOp.SUM, units=c.dists,
    roles=tuple(f"factor_{i}" for i in range(len(c.dists)))))


# ---- costs -----------------------------------------------------------------------------------------
def _param_bytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_param_bytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_param_bytes(v) for v in value.values())
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return 8
    return 0


def _param_scalars(value: Any) -> float:
    if isinstance(value, np.ndarray):
        return float(value.size)
    if isinstance(value, (tuple, list)):
        return sum(_param_scalars(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_param_scalars(v) for v in value.values())
    return 1.0 if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) else 0.0


def _own_work(dc: Decomposition) -> float:
    """Per-row work of a node's own emission: one plus its own numeric scalars (a FLOP proxy)."""
    return 1.0 + _param_scalars(dc.params)


def shard_children(node: Any, dc: Decomposition | None = None) -> tuple[Any, ...]:
    """The children ``node`` splits along its axis (empty for an atomic node)."""
    return tuple((dc or decomposition_of(node)).units)


def cost_children(model: Any) -> tuple[Any, ...]:
    """Every nested model of a node (units and owned), each of whose work counts in the node's cost."""
    dc = decomposition_of(model)
    return tuple(dc.units) + tuple(dc.owned)


def compute_cost(model: Any, _seen: set[int] | None = None) -> tuple[float, int]:
    """``(per-row FLOP proxy, parameter bytes)`` of the whole subtree (shared subtrees counted once)."""
    seen = set() if _seen is None else _seen
    if id(model) in seen:
        return 0.0, 0
    seen.add(id(model))
    dc = decomposition_of(model)
    flops, nbytes = _own_work(dc), _param_bytes(dc.params)
    for child in tuple(dc.units) + tuple(dc.owned):
        f, b = compute_cost(child, seen)
        flops, nbytes = flops + f, nbytes + b
    return flops, nbytes


def subtree_work(model: Any, _seen: set[int] | None = None) -> float:
    """The per-row work of a subtree: its own emission plus every descendant's, counted once."""
    return compute_cost(model, _seen)[0]


@attrs.frozen
class NodeSize:
    """One node of the sized tree: its axis, units, own and subtree bytes and work, children."""

    path: str
    axis: DecompAxis
    num_units: int
    own_param_bytes: int
    subtree_param_bytes: int
    subtree_work: float = 1.0
    children: tuple[NodeSize, ...] = ()


def size_model_tree(model: Any, _path: str = "", _seen: set[int] | None = None) -> NodeSize:
    """Size the ownership tree (each shared subtree under its first path only)."""
    seen = set() if _seen is None else _seen
    if id(model) in seen:
        raise ValueError("size_model_tree: the root is already in the traversal (a model containing itself?)")
    seen.add(id(model))
    dc = decomposition_of(model)
    kids = []
    named = [(dc.role(i), u) for i, u in enumerate(dc.units)] + [(f"owned_{i}", o) for i, o in enumerate(dc.owned)]
    for role, child in named:
        if id(child) not in seen:
            kids.append(size_model_tree(child, f"{_path}/{role}".lstrip("/"), seen))
    own_bytes = _param_bytes(dc.params)
    return NodeSize(_path, dc.axis, dc.num_units, own_bytes, own_bytes + sum(k.subtree_param_bytes for k in kids),
                    _own_work(dc) + sum(k.subtree_work for k in kids), tuple(kids))


@attrs.frozen
class AxisCandidate:
    """A splittable axis somewhere in the tree, with each unit's work and bytes."""

    path: str
    axis: DecompAxis
    reduction: ReductionOp
    num_units: int
    unit_works: tuple[float, ...]
    unit_bytes: tuple[int, ...] = ()

    @property
    def total_work(self) -> float:
        """Work of all units together."""
        return float(sum(self.unit_works))


def tree_axes(model: Any) -> list[AxisCandidate]:
    """Every splittable axis anywhere in the tree (root first, then depth-first), with per-unit work."""
    out: list[AxisCandidate] = []
    seen: set[int] = set()

    def walk(node: Any, path: str) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        dc = decomposition_of(node)
        if dc.is_shardable:
            costs = [compute_cost(u) for u in dc.units]
            out.append(AxisCandidate(path or "/", dc.axis, dc.reduction, len(dc.units),
                                     tuple(c[0] for c in costs), tuple(c[1] for c in costs)))
        for i, u in enumerate(dc.units):
            walk(u, f"{path}/{dc.role(i)}".lstrip("/"))
        for i, o in enumerate(dc.owned):
            walk(o, f"{path}/owned_{i}".lstrip("/"))

    walk(model, "")
    return out


def best_parallel_axis(model: Any, max_workers: int | None = None, *,
                       allowed_axes: frozenset[DecompAxis] | None = None) -> AxisCandidate | None:
    """The axis whose split removes the most serial work: ``total - max(heaviest unit, total / P)``."""
    found = [c for c in tree_axes(model) if allowed_axes is None or c.axis in allowed_axes]
    if not found:
        return None

    def benefit(c: AxisCandidate) -> float:
        p = c.num_units if max_workers is None else max(1, min(int(max_workers), c.num_units))
        return c.total_work - max(max(c.unit_works), c.total_work / p)

    return max(found, key=benefit)


@attrs.frozen
class ModelCut:
    """Units ``[start, stop)`` of the cut axis placed on ``device``, recombined by ``reduction``."""

    device: DeviceSpec
    start: int
    stop: int
    reduction: ReductionOp


@attrs.frozen
class ModelDecomposition:
    """The chosen decomposition: the axis, its cuts over the devices, and why."""

    axis: DecompAxis
    reduction: ReductionOp
    num_units: int
    cuts: tuple[ModelCut, ...]
    rationale: str
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    @property
    def is_model_parallel(self) -> bool:
        """Whether the model is split over more than one device."""
        return self.axis is not DecompAxis.NONE and len(self.cuts) > 1


def work_partition(unit_works: tuple[float, ...], weights: tuple[float, ...]) -> list[int]:
    """Unit counts of contiguous shards whose work follows ``weights`` (device throughputs); empty shards dropped.

    Each unit goes to the shard whose share of the work holds the unit's midpoint, so a heavy unit lands
    where most of it belongs rather than dragging its neighbours along."""
    n = len(unit_works)
    w = np.asarray(weights[: max(1, min(len(weights), n))], dtype=np.float64)
    capacity = np.cumsum(w / w.sum())
    works = np.asarray(unit_works, dtype=np.float64)
    cum = np.cumsum(works)
    total = float(cum[-1]) if n and cum[-1] > 0 else 1.0
    k = len(w)
    counts = [0] * k
    s = 0
    for i in range(n):
        mid = (float(cum[i]) - float(works[i]) / 2.0) / total
        target = int(np.searchsorted(capacity - 1e-12, mid))
        # one shard further at most, and never past an empty one; forced on when the units left only
        # just cover the shards left, so no shard stays empty for lack of units
        if s < k - 1 and counts[s] > 0 and (target > s or n - i <= k - 1 - s):
            s += 1
        counts[s] += 1
    return [c for c in counts if c > 0]


def decompose_model(model: Any, resources: Resources, *, n_data: int | None = None,
                    min_components_per_shard: int = 1, prefer_data_parallel: bool = True,
                    allowed_axes: frozenset[DecompAxis] | None = None) -> ModelDecomposition:
    """Place ``model`` on ``resources``: replicate it (data parallel) when that serves, else cut the best
    axis into contiguous unit ranges balanced by work and device throughput.

    mixle 0.8.2's rule: replicate when no axis is worth cutting or there is one device, or (with
    ``prefer_data_parallel``) when the model fits replicated (a device of unknown memory counts as
    fitting), the best axis has fewer than 2 x devices units and ``n_data`` is None or at least
    8 x devices rows."""
    if isinstance(min_components_per_shard, bool) or not isinstance(min_components_per_shard, int) \
            or min_components_per_shard < 1:
        raise ValueError(f"min_components_per_shard must be an int >= 1, got {min_components_per_shard!r}")
    devices = tuple(resources.devices)
    best = best_parallel_axis(model, max_workers=len(devices), allowed_axes=allowed_axes)
    root = decomposition_of(model)
    if best is None or len(devices) < 2:
        return ModelDecomposition(DecompAxis.NONE, ReductionOp.REPLICATE, root.num_units, (),
                                  "no splittable axis worth cutting, or one device: replicate the model, "
                                  "data-parallel")
    sized = size_model_tree(model)
    memories = [d.memory_bytes for d in devices if d.memory_bytes is not None]
    fits = not memories or sized.subtree_param_bytes <= min(memories)
    p = len(devices)
    if prefer_data_parallel and fits and best.num_units < 2 * p and (n_data is None or n_data >= 8 * p):
        # mixle 0.8.2's rule: few units per device and rows to spare, so replicating the model wins
        return ModelDecomposition(DecompAxis.NONE, ReductionOp.REPLICATE, best.num_units, (),
                                  "the model fits replicated and the rows fill the devices: data-parallel")
    shards = max(1, min(len(devices), best.num_units // min_components_per_shard))
    counts = work_partition(best.unit_works, tuple(d.throughput for d in devices[:shards]))
    cuts, start = [], 0
    for device, c in zip(devices, counts):
        cuts.append(ModelCut(device, start, start + c, best.reduction))
        start += c
    where = f" at {best.path}" if best.path not in ("", "/") else ""
    return ModelDecomposition(best.axis, best.reduction, best.num_units, tuple(cuts),
                              f"model parallel along {best.axis.value}{where}: {best.num_units} units over "
                              f"{len(cuts)} device(s), balanced by work",
                              {"path": best.path, "total_work": best.total_work})
