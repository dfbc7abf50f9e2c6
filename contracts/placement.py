"""Advisory placement and model-sharding plans for EM (pure data, JSON through the converter)."""

from __future__ import annotations

from typing import Any

import attrs

from mixle_parallel.contracts._checks import exact_bool, non_empty_str, non_negative_int, positive_int, str_tuple
from mixle_parallel.contracts.serialization import register_contract

__all__ = ["ComponentShard", "ModelShardingPlan", "Placement", "RowShard"]


def _ordered_range(inst: Any, attribute: Any, value: int) -> None:
    non_negative_int(inst, attribute, value)
    if attribute.name == "stop" and value < inst.start:
        raise ValueError(f"{type(inst).__name__}: stop={value} is below start={inst.start}")


def _tuple_of(cls: type) -> Any:
    def convert(values: Any) -> tuple[Any, ...]:
        out = tuple(values)
        for v in out:
            if not isinstance(v, cls):
                raise TypeError(f"expected {cls.__name__} items, got {type(v).__name__}")
        return out

    return convert


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
    shards: tuple[RowShard, ...] = attrs.field(converter=_tuple_of(RowShard))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
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
    shards: tuple[ComponentShard, ...] = attrs.field(converter=_tuple_of(ComponentShard))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    requires_split: bool = attrs.field(validator=exact_bool)
    fits: bool = attrs.field(validator=exact_bool)
    reason: str = attrs.field(validator=non_empty_str)
