"""ParallelPlan: an N-D process mesh and batch schedule, with all of its rank math (no torch)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from numbers import Integral
from typing import Any, NamedTuple

import attrs

from ._checks import non_negative_int, positive_int
from .enums import ALL_AXES, PHYSICAL_AXES, ParallelAxis
from .errors import ContractTypeError
from .serialization import SCHEMA_METADATA, register_contract

MAX_AXIS_SIZE = 2**31
"""Largest size of one axis (and of microbatches / accumulation steps): far beyond any real mesh."""


def _divisors(n: int, *, limit: int = 16) -> str:
    """The divisors of ``n`` as text (at most ``limit`` shown): trial division up to sqrt(n), milliseconds."""
    small, large, d = [], [], 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    found = small + large[::-1]
    shown = ", ".join(str(x) for x in found[:limit])
    return f"[{shown}{', ...' if len(found) > limit else ''}]"


_SIZE_SCHEMA = {SCHEMA_METADATA: {"minimum": 1, "maximum": MAX_AXIS_SIZE}}


def _exact_int(value: Any) -> Any:
    """An integral number that is not a bool (``numpy.int64(2)``, say) becomes a plain int; else unchanged."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    return value


def _axis_size(inst: Any, attribute: Any, value: Any) -> None:
    try:
        positive_int(inst, attribute, value)
    except TypeError as err:  # both kinds, as mixle 0.8.2 raises ValueError here
        raise ContractTypeError(str(err)) from None
    if value > MAX_AXIS_SIZE:
        raise ValueError(f"{type(inst).__name__}.{attribute.name}={value} is above the bound {MAX_AXIS_SIZE} (2**31)")


def as_axis(axis: ParallelAxis | str) -> ParallelAxis:
    """Accept an axis member or its name; anything else is a ValueError listing the axes."""
    if isinstance(axis, ParallelAxis):
        return axis
    try:
        return ParallelAxis(axis)
    except ValueError:
        allowed = ", ".join(a.value for a in ParallelAxis)
        raise ValueError(f"unknown parallel axis {axis!r}; allowed: {allowed}") from None


class _MeshShapeFields(NamedTuple):
    names: tuple[str, ...]
    shape: tuple[int, ...]


class MeshShape(_MeshShapeFields):
    """DeviceMesh dimension names and sizes of the active physical axes, slowest first.

    A NamedTuple, so it unpacks like mixle 0.8.2's plain ``(names, shape)`` tuple. Equality compares
    the axis -> size mapping of the axes of size > 1, whatever their order: ours lists the axes in
    torchtitan's rank order (pp, dp_replicate, dp_shard, cp, tp), mixle's in (dp_replicate, dp_shard,
    tp, pp, cp) with a size-1 dp_replicate for one rank, and both describe the same mesh.
    Built with distinct physical axis names and one size (an int in 1..2**31) per name.
    """

    __slots__ = ()

    def __new__(cls, names: Any, shape: Any) -> MeshShape:
        names, shape = tuple(names), tuple(shape)
        physical = {a.value for a in PHYSICAL_AXES}
        for name in names:
            if not isinstance(name, str) or name not in physical:
                raise ValueError(f"MeshShape.names holds {name!r}; allowed: {sorted(physical)}")
        if len(set(names)) != len(names):
            raise ValueError(f"MeshShape.names repeats an axis: {list(names)}")
        if len(shape) != len(names):
            raise ValueError(f"MeshShape has {len(names)} names but {len(shape)} sizes")
        for size in shape:
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_AXIS_SIZE:
                raise ValueError(f"MeshShape.shape holds {size!r}; sizes are ints in 1..{MAX_AXIS_SIZE}")
        return super().__new__(cls, names, shape)

    def sizes(self) -> dict[str, int]:
        """Axis name -> size of the axes of size > 1 (what equality compares)."""
        return {name: size for name, size in zip(self.names, self.shape) if size > 1}

    def __eq__(self, other: object) -> bool:
        other_sizes = _mesh_sizes(other)
        return NotImplemented if other_sizes is None else self.sizes() == other_sizes

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(frozenset(self.sizes().items()))


def _mesh_sizes(value: object) -> dict[str, int] | None:
    """The axis -> size mapping (sizes > 1) of a MeshShape or a plain ``(names, shape)`` pair, else None."""
    if isinstance(value, MeshShape):
        return value.sizes()
    if not (isinstance(value, tuple) and len(value) == 2):
        return None
    names, shape = value
    if not (isinstance(names, tuple) and isinstance(shape, tuple) and len(names) == len(shape)):
        return None
    if len(set(names)) != len(names):
        return None
    return {n: s for n, s in zip(names, shape) if not (isinstance(s, int) and s == 1)}


@register_contract
@attrs.frozen
class MeshCoordinate:
    """One rank's position: an index on every physical axis, plus its index inside its ep/etp groups."""

    pp: int = attrs.field(default=0, validator=non_negative_int)
    dp_replicate: int = attrs.field(default=0, validator=non_negative_int)
    dp_shard: int = attrs.field(default=0, validator=non_negative_int)
    cp: int = attrs.field(default=0, validator=non_negative_int)
    tp: int = attrs.field(default=0, validator=non_negative_int)
    ep: int = attrs.field(default=0, validator=non_negative_int)
    etp: int = attrs.field(default=0, validator=non_negative_int)

    def __getitem__(self, axis: ParallelAxis | str) -> int:
        return int(getattr(self, as_axis(axis).value))

    def __iter__(self) -> Iterator[tuple[str, int]]:
        """``(axis, index)`` pairs over every axis, so ``dict(coordinate)`` maps axis name -> index."""
        return iter(self.as_dict().items())

    def as_dict(self) -> dict[str, int]:
        """Axis name -> index, every axis."""
        return {a.value: self[a] for a in ALL_AXES}


@register_contract
@attrs.frozen
class ParallelPlan:
    """An explicit N-D process mesh and batch schedule.

    ``world_size`` is the product of the physical axes (dp_replicate, dp_shard, tp, pp, cp);
    ``ep`` and ``etp`` are overlapping groups cut from the data-parallel and tensor-parallel
    domains (``ep`` divides the data-parallel size, ``etp`` divides ``tp``).
    """

    dp_replicate: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    dp_shard: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    tp: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    pp: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    cp: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    ep: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    etp: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    microbatches: int = attrs.field(default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)
    gradient_accumulation_steps: int = attrs.field(
        default=1, validator=_axis_size, converter=_exact_int, metadata=_SIZE_SCHEMA)

    def __attrs_post_init__(self) -> None:
        dp = self.dp_replicate * self.dp_shard
        if dp % self.ep:
            replicas = math.lcm(self.dp_replicate, self.ep // math.gcd(self.ep, self.dp_shard))
            raise ValueError(
                f"ParallelPlan.ep={self.ep} must divide the data-parallel size "
                f"dp_replicate*dp_shard={dp}; choose ep from {_divisors(dp)}, or give the experts "
                f"data-parallel ranks to span (e.g. dp_replicate={replicas},ep={self.ep}): expert groups "
                "are cut from the data-parallel ranks, not added to the world"
            )
        if self.tp % self.etp:
            raise ValueError(
                f"ParallelPlan.etp={self.etp} must divide tp={self.tp}; "
                f"choose etp from {_divisors(self.tp)}"
            )

    # ---- sizes -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of physical ranks: the product of dp_replicate, dp_shard, tp, pp and cp."""
        return math.prod(self.size(a) for a in PHYSICAL_AXES)

    @property
    def data_parallel_size(self) -> int:
        """Ranks that see different data: dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    def size(self, axis: ParallelAxis | str) -> int:
        """The size of one axis."""
        return int(getattr(self, as_axis(axis).value))

    @property
    def active_axes(self) -> tuple[ParallelAxis, ...]:
        """Axes of size > 1, physical axes in mesh order then ep, etp."""
        return tuple(a for a in ALL_AXES if self.size(a) > 1)

    @property
    def axis_family(self) -> frozenset[ParallelAxis]:
        """The set of active axes: what a certificate covers, whatever the sizes."""
        return frozenset(self.active_axes)

    @property
    def mesh(self) -> MeshShape:
        """DeviceMesh names/shape of the active physical axes in order pp, dp_replicate, dp_shard, cp, tp.

        A plan of world size 1 has an empty mesh (no dimension is active).
        """
        active = [a for a in PHYSICAL_AXES if self.size(a) > 1]
        return MeshShape(tuple(a.value for a in active), tuple(self.size(a) for a in active))

    def validate_world_size(self, world_size: int) -> None:
        """Raise ValueError unless ``world_size`` equals the plan's physical world size."""
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise ContractTypeError(
                f"world_size must be an int (the number of launched processes), got {type(world_size).__name__} "
                f"({world_size!r})"
            )
        if world_size != self.world_size:
            sizes = " x ".join(f"{a.value}={self.size(a)}" for a in PHYSICAL_AXES if self.size(a) > 1)
            raise ValueError(
                f"the plan needs world size {self.world_size} ({sizes or 'one rank'}), "
                f"but {world_size} processes were launched; launch {self.world_size} ranks or change the plan"
            )

    # ---- rank math ---------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__} ({rank!r})")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the plan's world [0, {self.world_size})")

    def _physical_index(self, rank: int) -> dict[ParallelAxis, int]:
        index: dict[ParallelAxis, int] = {}
        rest = rank
        for axis in reversed(PHYSICAL_AXES):
            size = self.size(axis)
            index[axis] = rest % size
            rest //= size
        return index

    def coordinate(self, rank: int) -> MeshCoordinate:
        """The mesh coordinate of ``rank`` (row-major, tp fastest)."""
        self._check_rank(rank)
        idx = self._physical_index(rank)
        dp_index = idx[ParallelAxis.DP_REPLICATE] * self.dp_shard + idx[ParallelAxis.DP_SHARD]
        return MeshCoordinate(
            pp=idx[ParallelAxis.PP],
            dp_replicate=idx[ParallelAxis.DP_REPLICATE],
            dp_shard=idx[ParallelAxis.DP_SHARD],
            cp=idx[ParallelAxis.CP],
            tp=idx[ParallelAxis.TP],
            ep=dp_index % self.ep,
            etp=idx[ParallelAxis.TP] % self.etp,
        )

    def rank(self, coordinate: MeshCoordinate | Mapping[str, int]) -> int:
        """Inverse of ``coordinate``: the rank at a physical coordinate."""
        if isinstance(coordinate, Mapping):
            unknown = set(coordinate) - {a.value for a in ALL_AXES}
            if unknown:
                raise ValueError(f"unknown axes in coordinate: {sorted(unknown)}")
            coordinate = MeshCoordinate(**{str(k): v for k, v in coordinate.items()})
        if not isinstance(coordinate, MeshCoordinate):
            raise TypeError(f"coordinate must be a MeshCoordinate or a mapping, got {type(coordinate).__name__}")
        rank = 0
        for axis in PHYSICAL_AXES:
            size, value = self.size(axis), coordinate[axis]
            if value >= size:
                raise ValueError(f"coordinate {axis.value}={value} is outside [0, {size})")
            rank = rank * size + value
        expected = self.coordinate(rank)
        for axis in (ParallelAxis.EP, ParallelAxis.ETP):
            if coordinate[axis] not in (0, expected[axis]):
                raise ValueError(
                    f"coordinate {axis.value}={coordinate[axis]} disagrees with its physical axes, "
                    f"which place it at {axis.value}={expected[axis]}"
                )
        return rank

    def _groups_varying(self, axes: tuple[ParallelAxis, ...]) -> tuple[tuple[int, ...], ...]:
        """Rank lists that share every physical index except ``axes``, ordered by those axes."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.world_size):
            idx = self._physical_index(r)
            key = tuple(idx[a] for a in PHYSICAL_AXES if a not in axes)
            groups.setdefault(key, []).append(r)
        return tuple(tuple(g) for _, g in sorted(groups.items()))

    def data_parallel_group_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Every data-parallel group: ranks sharing pp, cp and tp, ordered by (dp_replicate, dp_shard)."""
        return self._groups_varying((ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD))

    def axis_group_ranks(self, axis: ParallelAxis | str) -> tuple[tuple[int, ...], ...]:
        """The rank lists of every process group of ``axis``; the groups partition the world.

        ``ep`` groups are contiguous blocks of ``ep`` ranks cut from each data-parallel group;
        ``etp`` groups are blocks of ``etp`` ranks cut from each tp group.
        """
        axis = as_axis(axis)
        if axis in PHYSICAL_AXES:
            return self._groups_varying((axis,))
        if axis is ParallelAxis.EP:
            parents, block = self.data_parallel_group_ranks(), self.ep
        else:
            parents, block = self._groups_varying((ParallelAxis.TP,)), self.etp
        return tuple(g[i : i + block] for g in parents for i in range(0, len(g), block))

    def group_of(self, rank: int, axis: ParallelAxis | str) -> tuple[int, ...]:
        """The ranks of the ``axis`` group that contains ``rank``."""
        self._check_rank(rank)
        for group in self.axis_group_ranks(axis):
            if rank in group:
                return group
        raise AssertionError("axis groups must partition the world")  # pragma: no cover

    def describe(self) -> str:
        """One line: the active axes and sizes, e.g. ``dp_shard=2 x tp=2 (world 4)``."""
        axes = " x ".join(f"{a.value}={self.size(a)}" for a in self.active_axes) or "single process"
        return f"{axes} (world {self.world_size})"

    @property
    def axis_sizes(self) -> dict[ParallelAxis, int]:
        """Every axis and its size (mixle 0.8.2's name)."""
        return {a: self.size(a) for a in ALL_AXES}

    def as_dict(self) -> dict[str, int]:
        """Axis sizes, microbatches, accumulation steps, world size and data-parallel size (mixle's shape);
        JSON documents go through ``to_dict`` instead."""
        return {**{a.value: n for a, n in self.axis_sizes.items()}, "microbatches": self.microbatches,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "world_size": self.world_size, "data_parallel_size": self.data_parallel_size}

    @classmethod
    def from_mapping(cls, sizes: Mapping[str, Any]) -> ParallelPlan:
        """Build a plan from a plain mapping of field names, rejecting unknown keys."""
        fields = {f.name for f in attrs.fields(cls)}
        unknown = set(sizes) - fields
        if unknown:
            raise ValueError(f"unknown ParallelPlan fields {sorted(unknown)}; allowed: {sorted(fields)}")
        return cls(**dict(sizes))


@register_contract
@attrs.frozen
class WorkerTopologyAttestation:
    """Runtime proof binding one launched rank to one planned mesh coordinate."""

    rank: int = attrs.field(validator=non_negative_int)
    world_size: int = attrs.field(validator=positive_int)
    coordinate: MeshCoordinate = attrs.field(validator=attrs.validators.instance_of(MeshCoordinate))

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise ValueError(f"WorkerTopologyAttestation.rank={self.rank} must be < world_size={self.world_size}")


def attest_worker_coordinate(plan: ParallelPlan, *, actual_world_size: int, rank: int) -> WorkerTopologyAttestation:
    """Validate a runtime rank and bind it to the plan's mesh coordinate (the executors' order)."""
    if not isinstance(plan, ParallelPlan):
        raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
    plan.validate_world_size(actual_world_size)
    return WorkerTopologyAttestation(rank=rank, world_size=actual_world_size, coordinate=plan.coordinate(rank))
