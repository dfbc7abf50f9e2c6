"""BackendCapabilities: what a backend actually executes, checked before any process starts."""

from __future__ import annotations

from typing import Any

import attrs

from ._checks import enum_frozenset, exact_bool, non_empty_str, str_frozenset, str_tuple
from .enums import KNOWN_PRECISIONS, ParallelAxis
from .errors import CapabilityError
from .plan import ParallelPlan
from .serialization import register_contract


def _precisions(inst: object, attribute: attrs.Attribute, value: frozenset[str]) -> None:
    if not value:
        raise ValueError("BackendCapabilities.precisions must name at least one precision")
    unknown = value - KNOWN_PRECISIONS
    if unknown:
        raise ValueError(
            f"BackendCapabilities.precisions has unknown {sorted(unknown)}; allowed: {sorted(KNOWN_PRECISIONS)}"
        )


def _axis_sets(values: Any) -> tuple[frozenset[ParallelAxis], ...]:
    convert = enum_frozenset(ParallelAxis)
    sets = {convert(v) for v in values}
    return tuple(sorted(sets, key=lambda s: sorted(a.value for a in s)))


def _incompatible(inst: object, attribute: attrs.Attribute, value: tuple[frozenset[ParallelAxis], ...]) -> None:
    for axis_set in value:
        if len(axis_set) < 2:
            raise ValueError(
                "BackendCapabilities.incompatible_axis_sets entries must name at least two axes, "
                f"got {sorted(a.value for a in axis_set)}"
            )


@register_contract
@attrs.frozen
class BackendCapabilities:
    """The axes, precisions and features a backend executes and tests, not merely accepts."""

    name: str = attrs.field(validator=non_empty_str)
    axes: frozenset[ParallelAxis] = attrs.field(converter=enum_frozenset(ParallelAxis))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    precisions: frozenset[str] = attrs.field(
        default=frozenset({"bf16", "fp32"}), converter=str_frozenset, validator=_precisions
    )
    distributed_optimizer: bool = attrs.field(default=False, validator=exact_bool)
    reshardable_checkpoint: bool = attrs.field(default=False, validator=exact_bool)
    elastic_restart: bool = attrs.field(default=False, validator=exact_bool)
    requirements: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    incompatible_axis_sets: tuple[frozenset[ParallelAxis], ...] = attrs.field(
        default=(), converter=_axis_sets, validator=_incompatible
    )

    def problems(self, plan: ParallelPlan, precision: str = "fp32") -> tuple[str, ...]:
        """Every reason this backend cannot run ``plan`` at ``precision``; empty when it can."""
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        found: list[str] = []
        for axis in plan.active_axes:
            if axis not in self.axes:
                supported = ", ".join(sorted(a.value for a in self.axes)) or "none"
                found.append(
                    f"backend {self.name!r} does not execute axis {axis.value} (size {plan.size(axis)}); "
                    f"it executes: {supported}. Set {axis.value}=1 or choose a backend that runs it"
                )
        if precision not in self.precisions:
            found.append(
                f"backend {self.name!r} does not support precision {precision!r}; "
                f"supported: {', '.join(sorted(self.precisions))}"
            )
        active = set(plan.active_axes)
        for axis_set in self.incompatible_axis_sets:
            if axis_set <= active:
                found.append(
                    f"backend {self.name!r} cannot compose axes {', '.join(sorted(a.value for a in axis_set))} "
                    "in one plan; set one of them to 1"
                )
        return tuple(found)

    def validate(self, plan: ParallelPlan, precision: str = "fp32") -> None:
        """Raise CapabilityError naming each axis/precision/composition this backend cannot run."""
        found = self.problems(plan, precision)
        if found:
            raise CapabilityError("; ".join(found))
