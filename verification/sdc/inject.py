"""Fault injection to prove SDC detection: flip bit ``b`` of element ``i`` of a named value.

Works on numpy arrays and torch tensors (torch is never imported here: tensors are recognised
by their methods). A ``FaultInjector`` holds planned ``BitFlip``s and applies one when the
executor reaches the matching (kind, name, rank, step); executors call
``injector.apply(kind, name, value, rank=..., step=...)`` at the points a fault could strike
(a local gradient before reduction, a parameter, an EM chunk's statistic).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np

FAULT_KINDS = frozenset({"gradient", "parameter", "statistic", "tensor"})
"""What a flip can strike."""


def _kind(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in FAULT_KINDS:
        raise ValueError(f"BitFlip.kind={value!r}; allowed: {sorted(FAULT_KINDS)}")


def _non_negative(inst: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"BitFlip.{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen
class BitFlip:
    """One planned fault: flip ``bit`` of flat element ``index`` of ``name`` at ``rank`` and ``step``.

    ``name="*"`` matches any value of the kind (the first one reached at that rank and step).
    """

    kind: str = attrs.field(validator=_kind)
    name: str
    rank: int = attrs.field(validator=_non_negative)
    step: int = attrs.field(validator=_non_negative)
    index: int = attrs.field(default=0, validator=_non_negative)
    bit: int = attrs.field(default=0, validator=_non_negative)

    def matches(self, kind: str, name: str, rank: int, step: int) -> bool:
        """True when this flip strikes ``name`` of ``kind`` at ``rank`` and ``step``."""
        return (self.kind == kind and self.rank == rank and self.step == step
                and (self.name == "*" or self.name == name))


def _is_torch(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "element_size")


_TORCH_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def flip_bit(value: Any, index: int, bit: int) -> Any:
    """Flip ``bit`` of flat element ``index`` of ``value`` in place (numpy or torch); returns ``value``."""
    if _is_torch(value):
        import torch

        target = value.data if value.requires_grad else value
        if not target.is_contiguous():
            raise ValueError("flip_bit needs a contiguous tensor; call .contiguous() on a copy first")
        width = target.element_size() * 8
        _check(index, bit, target.numel(), width)
        flat = target.view(-1).view(getattr(torch, _TORCH_INT[target.element_size()]))
        mask = -(1 << (width - 1)) if bit == width - 1 else 1 << bit
        flat[index] ^= mask
        return value
    if not isinstance(value, np.ndarray):
        raise TypeError(f"flip_bit works on numpy arrays and torch tensors, got {type(value).__name__}")
    if not value.flags.writeable or not value.flags.c_contiguous:
        raise ValueError("flip_bit needs a writeable, C-contiguous numpy array")
    width = value.dtype.itemsize * 8
    _check(index, bit, value.size, width)
    flat = value.reshape(-1).view(np.dtype(f"u{value.dtype.itemsize}"))
    flat[index] ^= flat.dtype.type(1 << bit)
    return value


def _check(index: int, bit: int, size: int, width: int) -> None:
    if not 0 <= index < size:
        raise IndexError(f"element {index} is outside a value of {size} elements")
    if not 0 <= bit < width:
        raise IndexError(f"bit {bit} is outside a {width}-bit element")


class FaultInjector:
    """Planned bit flips, applied once each when an executor reaches them; thread-safe."""

    def __init__(self, flips: Iterable[BitFlip] = ()) -> None:
        self._pending = list(flips)
        self._applied: list[BitFlip] = []
        self._lock = threading.Lock()

    def add(self, flip: BitFlip) -> None:
        """Plan one more flip."""
        with self._lock:
            self._pending.append(flip)

    @property
    def applied(self) -> tuple[BitFlip, ...]:
        """Flips that struck, in order."""
        with self._lock:
            return tuple(self._applied)

    @property
    def pending(self) -> tuple[BitFlip, ...]:
        """Flips not reached yet."""
        with self._lock:
            return tuple(self._pending)

    def claim(self, kind: str, name: str, *, rank: int, step: int) -> BitFlip | None:
        """Take the planned flip matching (kind, name, rank, step), if any, and mark it applied.

        For executors that strike the value elsewhere (inside a worker process) with ``flip_bit``.
        """
        with self._lock:
            for flip in self._pending:
                if flip.matches(kind, name, rank, step):
                    self._pending.remove(flip)
                    self._applied.append(flip)
                    return flip
        return None

    def apply(self, kind: str, name: str, value: Any, *, rank: int, step: int) -> bool:
        """Flip ``value`` in place if a planned flip matches; True when one struck."""
        with self._lock:
            for flip in self._pending:
                if flip.matches(kind, name, rank, step):
                    size = value.numel() if _is_torch(value) else np.asarray(value).size
                    flip_bit(value, flip.index % max(size, 1), flip.bit)
                    self._pending.remove(flip)
                    self._applied.append(flip)
                    return True
        return False

    def apply_all(self, kind: str, values: dict[str, Any], *, rank: int, step: int) -> tuple[str, ...]:
        """``apply`` over a name -> value mapping (e.g. every local gradient); the names struck."""
        return tuple(name for name, value in values.items() if self.apply(kind, name, value, rank=rank, step=step))

