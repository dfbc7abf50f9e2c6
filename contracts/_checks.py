"""attrs validators and converters shared by the contracts: strict types, messages that say the fix."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

E = TypeVar("E", bound=Enum)


def _owner(inst: Any) -> str:
    return type(inst).__name__


def positive_int(inst: Any, attribute: Any, value: Any) -> None:
    """An exact int (not a bool) >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be an int, got {type(value).__name__} ({value!r})"
        )
    if value < 1:
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be >= 1, got {value}")


def non_negative_int(inst: Any, attribute: Any, value: Any) -> None:
    """An exact int (not a bool) >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be an int, got {type(value).__name__} ({value!r})"
        )
    if value < 0:
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be >= 0, got {value}")


def optional_non_negative_int(inst: Any, attribute: Any, value: Any) -> None:
    """None or an exact int >= 0."""
    if value is not None:
        non_negative_int(inst, attribute, value)


def exact_bool(inst: Any, attribute: Any, value: Any) -> None:
    """A real bool, not a truthy int or string."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be a bool, got {type(value).__name__} ({value!r})"
        )


def optional_bool(inst: Any, attribute: Any, value: Any) -> None:
    """None or a real bool."""
    if value is not None:
        exact_bool(inst, attribute, value)


def non_empty_str(inst: Any, attribute: Any, value: Any) -> None:
    """A string with at least one non-blank character."""
    if not isinstance(value, str):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be a str, got {type(value).__name__} ({value!r})"
        )
    if not value.strip():
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be a non-empty string")


def optional_str(inst: Any, attribute: Any, value: Any) -> None:
    """None or a str."""
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be a str or None, got {type(value).__name__}"
        )


def finite_float(inst: Any, attribute: Any, value: Any) -> None:
    """A finite real number (ints accepted, bools not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be a number, got {type(value).__name__} ({value!r})"
        )
    if not math.isfinite(value):
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be finite, got {value}")


def real_number(inst: Any, attribute: Any, value: Any) -> None:
    """Any real number, NaN and infinities included (a skipped step's loss may be NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{_owner(inst)}.{attribute.name} must be a number, got {type(value).__name__} ({value!r})"
        )


def finite_non_negative(inst: Any, attribute: Any, value: Any) -> None:
    """A finite number >= 0."""
    finite_float(inst, attribute, value)
    if value < 0:
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be >= 0, got {value}")


def optional_finite_non_negative(inst: Any, attribute: Any, value: Any) -> None:
    """None or a finite number >= 0."""
    if value is not None:
        finite_non_negative(inst, attribute, value)


def positive_finite(inst: Any, attribute: Any, value: Any) -> None:
    """A finite number > 0."""
    finite_float(inst, attribute, value)
    if value <= 0:
        raise ValueError(f"{_owner(inst)}.{attribute.name} must be > 0, got {value}")


def to_float(value: Any) -> Any:
    """Canonicalize ints to floats, leaving other types for the validator to reject."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def to_optional_float(value: Any) -> Any:
    """``to_float`` that lets None through."""
    return None if value is None else to_float(value)


def enum_converter(enum_cls: type[E]) -> Callable[[Any], E]:
    """Accept an enum member or its value; anything else raises with the allowed values."""

    def convert(value: Any) -> E:
        if isinstance(value, enum_cls):
            return value
        try:
            return enum_cls(value)
        except (ValueError, TypeError):
            allowed = ", ".join(repr(m.value) for m in enum_cls)
            raise ValueError(f"{value!r} is not a {enum_cls.__name__}; allowed: {allowed}") from None

    return convert


def enum_tuple(enum_cls: type[E]) -> Callable[[Any], tuple[E, ...]]:
    """Convert an iterable of enum members/values to a tuple, order kept."""
    one = enum_converter(enum_cls)

    def convert(values: Any) -> tuple[E, ...]:
        if isinstance(values, (str, bytes)):
            values = (values,)
        return tuple(one(v) for v in values)

    return convert


def enum_frozenset(enum_cls: type[E]) -> Callable[[Any], frozenset[E]]:
    """Convert an iterable of enum members/values to a frozenset."""
    one = enum_converter(enum_cls)

    def convert(values: Any) -> frozenset[E]:
        if isinstance(values, (str, bytes)):
            values = (values,)
        return frozenset(one(v) for v in values)

    return convert


def str_tuple(values: Any) -> tuple[str, ...]:
    """Convert an iterable of strings to a tuple, rejecting a bare string (a common slip)."""
    if isinstance(values, str):
        return (values,)
    out = tuple(values)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"expected strings, got {type(v).__name__} ({v!r})")
    return out


def str_frozenset(values: Any) -> frozenset[str]:
    """Convert an iterable of strings to a frozenset."""
    return frozenset(str_tuple(values))


def tuple_of(cls: type, where: str) -> Callable[[Any], tuple[Any, ...]]:
    """A converter to a tuple whose items must all be ``cls`` instances; ``where`` names the field in errors."""

    def convert(values: Any) -> tuple[Any, ...]:
        out = tuple(values)
        for v in out:
            if not isinstance(v, cls):
                raise TypeError(f"{where} holds {cls.__name__} items, got {type(v).__name__}")
        return out

    return convert
