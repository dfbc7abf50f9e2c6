"""torch_native's default loss: token-level cross-entropy over every position's logits."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .layouts import unwrap

IGNORE_INDEX = -100
_ALL_LOGITS_FLAG = "return_all_logits"
_takes_flag: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _takes_all_logits_flag(module: nn.Module) -> bool:
    """True when the (unwrapped) module's forward takes ``return_all_logits`` (mixle's CausalLM does)."""
    inner = unwrap(module)
    cached = _takes_flag.get(inner)
    if cached is None:
        try:
            cached = _ALL_LOGITS_FLAG in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):  # a builtin forward without a signature
            cached = False
        _takes_flag[inner] = cached
    return cached


def _logits(module: nn.Module, inputs: Any) -> Any:
    if _takes_all_logits_flag(module):
        return module(inputs, return_all_logits=True)
    return module(inputs)


def lm_token_loss(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Default loss: the token-level cross-entropy *sum* of the module's logits at every position, and the
    counted tokens (targets equal to -100 are ignored).

    The logits are ``module(inputs, return_all_logits=True)`` when the module's forward takes that flag
    (mixle's CausalLM returns only the last position otherwise), else ``module(inputs)``; they must be
    shaped ``targets.shape + (vocab,)``.
    """
    logits = _logits(module, inputs)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"the default loss expects module(inputs) to return a logits tensor, got {type(logits).__name__}; "
            "pass loss_fn=lambda module, x, y: (loss_sum, counted_targets) to prepare() for other outputs"
        )
    if logits.dim() != targets.dim() + 1 or tuple(logits.shape[:-1]) != tuple(targets.shape):
        raise ValueError(
            f"the default loss expects logits shaped targets.shape + (vocab,) = {tuple(targets.shape)} + (vocab,), "
            f"got {tuple(logits.shape)}; a language model must return every position's logits (a forward "
            f"taking '{_ALL_LOGITS_FLAG}' is called with it set to True), or pass "
            "loss_fn=lambda module, x, y: (loss_sum, counted_targets) to prepare()"
        )
    flat = logits.reshape(-1, logits.shape[-1]).float()
    labels = targets.reshape(-1)
    loss_sum = F.cross_entropy(flat, labels, reduction="sum", ignore_index=IGNORE_INDEX)
    return loss_sum, (labels != IGNORE_INDEX).sum()
