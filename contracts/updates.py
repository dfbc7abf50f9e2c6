"""DistributedUpdate and ParameterLayout: what one update communicates and how a parameter is laid out."""

from __future__ import annotations

import re
from typing import Any

import attrs

from ._checks import (
    enum_converter,
    enum_tuple,
    exact_bool,
    non_empty_str,
    non_negative_int,
    optional_bool,
    optional_finite_non_negative,
    optional_str,
    str_tuple,
    to_optional_float,
)
from .enums import PHYSICAL_AXES, CollectiveKind, ParallelAxis, PayloadKind, StateLayout
from .serialization import register_contract


def _unique_axes(inst: object, attribute: attrs.Attribute, value: tuple[ParallelAxis, ...]) -> None:
    if len(set(value)) != len(value):
        raise ValueError(f"{type(inst).__name__}.{attribute.name} repeats an axis: {[a.value for a in value]}")


@register_contract
@attrs.frozen
class DistributedUpdate:
    """One executable communication step, with the numerical evidence (if any) that it is right.

    A collective never claims ``exact`` (rounding depends on the reduction order); evidence is
    all-or-nothing: an evidence id comes with a positive sample count, an observed determinism
    flag and both error bounds, and without an id none of those may be set.
    """

    node_id: str = attrs.field(validator=non_empty_str)
    payload: PayloadKind = attrs.field(converter=enum_converter(PayloadKind))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    collective: CollectiveKind = attrs.field(converter=enum_converter(CollectiveKind))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    mesh_axes: tuple[ParallelAxis, ...] = attrs.field(converter=enum_tuple(ParallelAxis), validator=_unique_axes)  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    state_layout: StateLayout = attrs.field(converter=enum_converter(StateLayout))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    exact: bool = attrs.field(validator=exact_bool)
    notes: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    contract_exact: bool = attrs.field(default=False, validator=exact_bool)
    determinism_observed: bool | None = attrs.field(default=None, validator=optional_bool)
    maximum_absolute_error: float | None = attrs.field(
        default=None, converter=to_optional_float, validator=optional_finite_non_negative
    )
    maximum_relative_error: float | None = attrs.field(
        default=None, converter=to_optional_float, validator=optional_finite_non_negative
    )
    numerics_evidence_id: str | None = attrs.field(default=None, validator=optional_str)
    numerics_sample_count: int = attrs.field(default=0, validator=non_negative_int)

    def __attrs_post_init__(self) -> None:
        if self.exact and self.collective is not CollectiveKind.NONE:
            raise ValueError(
                f"DistributedUpdate {self.node_id!r}: a {self.collective.value} collective cannot claim "
                "exact=True (its rounding depends on reduction order); set exact=False and attach evidence"
            )
        if self.collective is not CollectiveKind.NONE and not self.mesh_axes:
            raise ValueError(
                f"DistributedUpdate {self.node_id!r}: collective {self.collective.value} needs the mesh "
                "axes it runs over; set mesh_axes"
            )
        evidence = {
            "determinism_observed": self.determinism_observed,
            "maximum_absolute_error": self.maximum_absolute_error,
            "maximum_relative_error": self.maximum_relative_error,
        }
        if self.numerics_evidence_id is not None:
            if not self.numerics_evidence_id.strip():
                raise ValueError(f"DistributedUpdate {self.node_id!r}: numerics_evidence_id must not be blank")
            missing = [k for k, v in evidence.items() if v is None]
            if self.numerics_sample_count < 1:
                missing.append("numerics_sample_count (> 0)")
            if missing:
                raise ValueError(
                    f"DistributedUpdate {self.node_id!r}: evidence {self.numerics_evidence_id!r} is "
                    f"incomplete, missing {', '.join(missing)}; evidence is all-or-nothing"
                )
        else:
            present = [k for k, v in evidence.items() if v is not None]
            if self.numerics_sample_count:
                present.append("numerics_sample_count")
            if present:
                raise ValueError(
                    f"DistributedUpdate {self.node_id!r}: {', '.join(present)} given without a "
                    "numerics_evidence_id; evidence is all-or-nothing"
                )

    @property
    def has_evidence(self) -> bool:
        """True when numerical evidence is attached."""
        return self.numerics_evidence_id is not None


_PLACEMENT = re.compile(r"^(Replicate\(\)|Partial\((sum|avg|max|min)?\)|Shard\((\d+)\))$")


def _shape(values: Any) -> tuple[int, ...]:
    out = tuple(values)
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"ParameterLayout.global_shape must hold ints >= 0, got {list(out)}")
    return out


def _placement_pairs(values: Any) -> tuple[tuple[ParallelAxis, str], ...]:
    out: list[tuple[ParallelAxis, str]] = []
    for pair in values:
        axis, placement = pair
        out.append((enum_converter(ParallelAxis)(axis), placement))
    return tuple(out)


@register_contract
@attrs.frozen
class ParameterLayout:
    """Stable logical identity and global layout of one parameter, from its real DTensor placements."""

    logical_id: str = attrs.field(validator=non_empty_str)
    global_shape: tuple[int, ...] = attrs.field(converter=_shape)
    placements: tuple[tuple[ParallelAxis, str], ...] = attrs.field(default=(), converter=_placement_pairs)
    shared_group: str | None = attrs.field(default=None, validator=optional_str)
    optimizer_state: StateLayout = attrs.field(
        default=StateLayout.REPLICATED, converter=enum_converter(StateLayout)  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    )

    def __attrs_post_init__(self) -> None:
        seen: set[ParallelAxis] = set()
        for axis, placement in self.placements:
            if axis not in PHYSICAL_AXES:
                raise ValueError(
                    f"ParameterLayout {self.logical_id!r}: placement axis {axis.value} is not a mesh "
                    f"dimension; use one of {[a.value for a in PHYSICAL_AXES]}"
                )
            if axis in seen:
                raise ValueError(f"ParameterLayout {self.logical_id!r}: axis {axis.value} placed twice")
            seen.add(axis)
            match = _PLACEMENT.match(placement) if isinstance(placement, str) else None
            if match is None:
                raise ValueError(
                    f"ParameterLayout {self.logical_id!r}: placement {placement!r} on {axis.value} must be "
                    "'Replicate()', 'Shard(d)' or 'Partial()'"
                )
            if match.group(3) is not None and int(match.group(3)) >= len(self.global_shape):
                raise ValueError(
                    f"ParameterLayout {self.logical_id!r}: {placement} on {axis.value} shards a dimension "
                    f"the shape {self.global_shape} does not have"
                )
