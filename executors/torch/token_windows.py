"""Token windows for streaming next-token training: rank shards, the shared step schedule, padded batches.

A corpus of token ids is cut into one contiguous shard per rank (``shard_by_rank``); a window is
``block`` consecutive tokens and its target the token after it. Every rank runs the same number of
steps per epoch (the largest rank's batch count), so a rank whose shard ran out feeds a fully
masked batch and no rank leaves a collective early. Nothing here knows about process groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from numbers import Integral
from typing import Any

import attrs
import numpy as np
import torch

from .losses import IGNORE_INDEX

__all__ = ["WindowSchedule", "padded_batch", "rank_window_schedule", "shard_bounds", "validate_token_ids",
           "window_batches"]

_INT64 = np.iinfo(np.int64)


def exact_int(value: Any, name: str, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; bools, fractions and other types are refused by name."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def exact_bool(value: Any, name: str) -> bool:
    """``value`` when it is a real bool (a string such as ``"false"`` is refused, not read as truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def validate_token_ids(token_ids: Any) -> np.ndarray:
    """A 1-D int64 copy of ``token_ids``: finite, integer-valued, non-negative and within int64."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be a 1-D array of token ids, got shape {ids.shape}")
    if ids.dtype == np.bool_ or not (np.issubdtype(ids.dtype, np.integer) or np.issubdtype(ids.dtype, np.floating)):
        raise TypeError(f"token_ids must hold integers, got dtype {ids.dtype}")
    if ids.size and np.issubdtype(ids.dtype, np.floating):
        if not np.all(np.isfinite(ids)):
            raise ValueError("token_ids holds NaN or infinite values; token ids are finite integers")
        if not np.array_equal(ids, np.trunc(ids)):
            raise ValueError("token_ids holds fractional values; token ids are exact integers")
        if ids.min() < _INT64.min or ids.max() > _INT64.max:
            raise ValueError("token_ids holds values outside the int64 range")
    if ids.size and np.issubdtype(ids.dtype, np.unsignedinteger) and int(ids.max()) > _INT64.max:
        raise ValueError("token_ids holds values outside the int64 range")
    out = ids.astype(np.int64)
    if out.size and int(out.min()) < 0:
        raise ValueError(f"token_ids holds a negative id ({int(out.min())}); ids index a vocabulary from 0")
    return out


def shard_bounds(n_tokens: int, world_size: int, rank: int) -> tuple[int, int]:
    """The token range ``[start, stop)`` rank ``rank`` of ``world_size`` keeps (contiguous, sizes differ by <= 1)."""
    return rank * n_tokens // world_size, (rank + 1) * n_tokens // world_size


@attrs.frozen
class WindowSchedule:
    """Windows per rank and the one step count per epoch every rank runs."""

    window_counts: tuple[int, ...]
    steps_per_epoch: int

    def real_targets(self, step: int, batch_size: int) -> int:
        """Targets of all ranks together at ``step`` (the masked padding excluded)."""
        return sum(min(batch_size, max(0, count - step * batch_size)) for count in self.window_counts)


def rank_window_schedule(n_tokens: int, world_size: int, *, block: int, batch_size: int,
                         shard_by_rank: bool) -> WindowSchedule:
    """Each rank's window count (``shard length - block``) and ``max ceil(windows / batch_size)`` steps."""
    if shard_by_rank and world_size > 1:
        lengths = tuple(b - a for a, b in (shard_bounds(n_tokens, world_size, r) for r in range(world_size)))
    else:
        lengths = (n_tokens,) * world_size
    windows = tuple(max(0, length - block) for length in lengths)
    steps = max((-(-count // batch_size) for count in windows), default=0)
    return WindowSchedule(windows, steps)


def window_batches(ids: np.ndarray, *, block: int, batch_size: int, shuffle: bool,
                   seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(contexts (b, block), next tokens (b,))`` batches of one epoch, built one batch at a time.

    The window order is ``RandomState(seed).permutation(n_windows)`` with ``shuffle`` (mixle 0.8.2's
    epoch order), else the corpus order.
    """
    n = len(ids) - block
    if n <= 0:
        return
    order = np.random.RandomState(seed).permutation(n) if shuffle else np.arange(n)
    offsets = np.arange(block)
    for k in range(0, n, batch_size):
        starts = order[k:k + batch_size]
        yield ids[starts[:, None] + offsets[None, :]], ids[starts + block]


def padded_batch(batch: tuple[np.ndarray, np.ndarray] | None, *, block: int, batch_size: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A full ``batch_size`` step batch: real rows first, then token-0 contexts whose targets are ignored."""
    x = torch.zeros((batch_size, block), dtype=torch.int64)
    y = torch.full((batch_size,), IGNORE_INDEX, dtype=torch.int64)
    if batch is not None and len(batch[1]):
        real = len(batch[1])
        x[:real] = torch.from_numpy(np.ascontiguousarray(batch[0]))
        y[:real] = torch.from_numpy(np.ascontiguousarray(batch[1]))
    return x.to(device), y.to(device)
