"""A window's commit as arithmetic: its global totals -> the step's loss, gradient norm, clip and scale.

``decide`` is pure (numbers in, a ``Commit`` out): the global loss is the loss sum over the global
target count; the gradients are the global mean times ``coef`` (1 / the count when the backward left
sums, 1 when the DDP scheme already made the mean); a step with no counted target, a non-finite flag,
loss or norm is refused; a norm over ``max_grad_norm`` is clipped by ``max_grad_norm / (norm + 1e-6)``.
``step`` applies one: the scale (skipped at 1), ``optimizer.step()`` and the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from .grads import scale_grads

__all__ = ["Commit", "WindowTotals", "decide", "step"]

CLIP_EPSILON = 1e-6
"""Added to the norm in the clip coefficient, as ``torch.nn.utils.clip_grad_norm_`` does."""


@attrs.frozen
class WindowTotals:
    """A window's counts summed over the world, and its gradients' squared norm."""

    loss_sum: float
    examples: float
    tokens: float
    nonfinite: bool
    square: float
    """Squared norm of the gradients as they are (the global mean when ``grads_are_means``, else sums)."""
    grads_are_means: bool
    rank_seconds: tuple[float, ...] | None = None
    """Health's per-rank step times, which rode the counts' all-reduce."""

    @classmethod
    def from_values(cls, values: Sequence[float], square: float, *, grads_are_means: bool) -> WindowTotals:
        """From the reduced counts vector ``[loss_sum, examples, tokens, nonfinite, *rank_seconds]``."""
        loss_sum, examples, tokens, nonfinite = (float(v) for v in values[:4])
        rest = tuple(float(v) for v in values[4:])
        return cls(loss_sum=loss_sum, examples=examples, tokens=tokens, nonfinite=bool(nonfinite),
                   square=float(square), grads_are_means=grads_are_means, rank_seconds=rest or None)


@attrs.frozen
class Commit:
    """What a commit does: ``refused`` (a reason) or the step with its loss, norm, clip and scale."""

    loss: float
    norm: float
    coef: float
    clipped: bool
    examples: int
    tokens: int
    refused: str | None = None
    """``"no_counted_targets"`` or ``"nonfinite"`` when nothing may be committed."""


def decide(totals: WindowTotals, max_grad_norm: float | None) -> Commit:
    """The commit of a window from its global totals (pure arithmetic, the same on every rank)."""
    examples, tokens = int(round(totals.examples)), int(round(totals.tokens))
    if totals.tokens <= 0:
        return Commit(math.nan, math.nan, 0.0, False, examples, tokens, refused="no_counted_targets")
    loss = totals.loss_sum / totals.tokens
    coef = 1.0 if totals.grads_are_means else 1.0 / totals.tokens
    norm = math.sqrt(totals.square) * coef if totals.square >= 0 else math.nan
    if totals.nonfinite or not (math.isfinite(norm) and math.isfinite(loss)):
        return Commit(loss, norm, 0.0, False, examples, tokens, refused="nonfinite")
    clipped = max_grad_norm is not None and norm > max_grad_norm
    if clipped:
        coef *= max_grad_norm / (norm + CLIP_EPSILON)  # type: ignore[operator]  # clipped implies a bound
    return Commit(loss, norm, coef, clipped, examples, tokens)


def group_learning_rates(optimizer: Any) -> tuple[float, ...]:
    """The learning rate of each of ``optimizer``'s parameter groups (a tensor rate read as a float)."""
    rates = []
    for group in getattr(optimizer, "param_groups", ()):
        rate = group.get("lr") if isinstance(group, dict) else None
        if rate is None:
            return ()
        rates.append(float(rate.item() if isinstance(rate, torch.Tensor) else rate))
    return tuple(rates)


def step(commit: Commit, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Apply a commit: scale the gradients to the clipped global mean, step the optimizer and the scheduler."""
    if commit.coef != 1.0:
        scale_grads(params, commit.coef)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
