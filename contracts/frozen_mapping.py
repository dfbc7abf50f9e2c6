"""A hashable, read-only mapping so frozen contracts can carry free-form JSON metadata."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

_SCALARS = (str, int, float, bool, type(None))


def freeze_json(value: Any, *, where: str = "value") -> Any:
    """Recursively turn JSON-like data into hashable form: dicts -> FrozenDict, lists -> tuples."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping):
        return FrozenDict(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(v, where=f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(
        f"{where} must be JSON data (str, int, float, bool, None, list, dict), "
        f"got {type(value).__name__}; convert it before putting it in a contract"
    )


def thaw_json(value: Any) -> Any:
    """Inverse of ``freeze_json``: plain dicts and lists for ``json.dumps``."""
    if isinstance(value, FrozenDict):
        return {k: thaw_json(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple):
        return [thaw_json(v) for v in value]
    return value


class FrozenDict(Mapping[str, Any]):
    """Immutable str-keyed mapping of JSON values, equal and hashable by value."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(data or {}, **kwargs)
        for key in merged:
            if not isinstance(key, str):
                raise TypeError(f"mapping keys must be str, got {type(key).__name__} ({key!r})")
        self._data = {k: freeze_json(v, where=f"[{k!r}]") for k, v in sorted(merged.items())}
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._data) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready copy."""
        return thaw_json(self)


def to_frozen_dict(value: Any) -> FrozenDict:
    """attrs converter: None or a mapping -> FrozenDict."""
    if isinstance(value, FrozenDict):
        return value
    if value is None:
        return FrozenDict()
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__} ({value!r})")
    return FrozenDict(value)
