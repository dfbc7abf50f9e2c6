"""Advisory placement and model-sharding plans for EM (pure data, JSON through the converter)."""

from __future__ import annotations

from typing import Any

import attrs

from ._checks import (
    exact_bool,
    non_empty_str,
    non_negative_int,
    positive_int,
    str_tuple,
    tuple_of,
)
from .resources import DeviceSpec
from .serialization import register_contract

__all__ = ["ComponentShard", "DeviceCapacityError", "ModelShard", "ModelShardingPlan", "Placement", "PlacementShard",
           "RowShard"]


def _ordered_range(inst: Any, attribute: Any, value: int) -> None:
    non_negative_int(inst, attribute, value)
    if attribute.name == "stop" and value < inst.start:
        raise ValueError(f"{type(inst).__name__}: stop={value} is below start={inst.start}")


@register_contract
@attrs.frozen
class RowShard:
    """Rows ``[start, stop)`` (whole chunks ``[first_chunk, last_chunk)``) placed on one device."""

    device: str = attrs.field(validator=non_empty_str)
    start: int = attrs.field(validator=_ordered_range)
    stop: int = attrs.field(validator=_ordered_range)
    first_chunk: int = attrs.field(validator=non_negative_int)
    last_chunk: int = attrs.field(validator=non_negative_int)
    resident_bytes: int = attrs.field(validator=non_negative_int)
    """Everything resident on the device for this plan: its data, the model and working memory."""


@register_contract
@attrs.frozen
class Placement:
    """Where each row range of the data goes, by device throughput, and whether it fits."""

    num_rows: int = attrs.field(validator=non_negative_int)
    num_chunks: int = attrs.field(validator=positive_int)
    bytes_per_row: int = attrs.field(validator=non_negative_int)
    model_bytes: int = attrs.field(validator=non_negative_int)
    shards: tuple[RowShard, ...] = attrs.field(converter=tuple_of(RowShard, "Placement.shards"))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    fits: bool = attrs.field(validator=exact_bool)
    notes: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.shards:
            raise ValueError("Placement needs at least one shard")
        covered = sum(s.stop - s.start for s in self.shards)
        if covered != self.num_rows:
            raise ValueError(f"Placement shards cover {covered} rows, the data has {self.num_rows}")


@register_contract
@attrs.frozen
class ComponentShard:
    """Components ``[start, stop)`` of a mixture owned by one device."""

    device: str = attrs.field(validator=non_empty_str)
    start: int = attrs.field(validator=_ordered_range)
    stop: int = attrs.field(validator=_ordered_range)
    resident_bytes: int = attrs.field(validator=non_negative_int)


@register_contract
@attrs.frozen
class ModelShardingPlan:
    """Advisory component-axis plan: replicate the model, or split its components across devices."""

    axis: str = attrs.field(validator=non_empty_str)
    num_components: int = attrs.field(validator=positive_int)
    model_bytes: int = attrs.field(validator=non_negative_int)
    shards: tuple[ComponentShard, ...] = attrs.field(converter=tuple_of(ComponentShard, "ModelShardingPlan.shards"))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    requires_split: bool = attrs.field(validator=exact_bool)
    fits: bool = attrs.field(validator=exact_bool)
    reason: str = attrs.field(validator=non_empty_str)


class DeviceCapacityError(MemoryError, ValueError):
    """A shard's estimated bytes exceed its device's memory: a ``MemoryError`` (what mixle 0.8.2 raises) and a
    ``ValueError`` (an invalid contract, so documents fail with a ContractError)."""


def _device_spec(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, DeviceSpec):
        raise TypeError(f"{type(inst).__name__}.device must be a DeviceSpec, got {type(value).__name__}")


def _fits(shard: Any, total: int) -> None:
    memory = shard.device.memory_bytes
    if memory is not None and total > memory:
        raise DeviceCapacityError(f"{type(shard).__name__} on {shard.device.name} needs {total} bytes but the device "
                                  f"holds {memory}; move rows or components to other devices")


@register_contract
@attrs.frozen
class PlacementShard:
    """mixle's placement shard: rows ``[start, stop)`` on one device, with their encoded and working bytes."""

    device: DeviceSpec = attrs.field(validator=_device_spec)
    start: int = attrs.field(validator=_ordered_range)
    stop: int = attrs.field(validator=_ordered_range)
    sub_chunks: int = attrs.field(default=1, validator=positive_int)
    encoded_bytes: int = attrs.field(default=0, validator=non_negative_int)
    transient_bytes: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def size(self) -> int:
        """Rows on this shard."""
        return self.stop - self.start

    @property
    def total_bytes(self) -> int:
        """Encoded plus transient bytes."""
        return self.encoded_bytes + self.transient_bytes


def _component_stop(inst: Any, attribute: Any, value: int) -> None:
    non_negative_int(inst, attribute, value)
    if value <= inst.component_start:
        raise ValueError(f"ModelShard: component_stop={value} must be above component_start={inst.component_start}")


@register_contract
@attrs.frozen
class ModelShard:
    """mixle's component-axis model shard: components ``[component_start, component_stop)`` on one device."""

    device: DeviceSpec = attrs.field(validator=_device_spec)
    component_start: int = attrs.field(validator=non_negative_int)
    component_stop: int = attrs.field(validator=_component_stop)
    parameter_bytes: int = attrs.field(default=0, validator=non_negative_int)
    statistic_bytes: int = attrs.field(default=0, validator=non_negative_int)

    def __attrs_post_init__(self) -> None:
        _fits(self, self.total_bytes)

    @property
    def num_components(self) -> int:
        """Components on this shard."""
        return self.component_stop - self.component_start

    @property
    def total_bytes(self) -> int:
        """Parameter plus statistic bytes."""
        return self.parameter_bytes + self.statistic_bytes
