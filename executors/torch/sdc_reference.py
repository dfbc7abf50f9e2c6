"""The SDC audit's independent reference for training: an audited window's gradient on a plain copy of the module.

The executor computes a gradient through its own machinery (DDP's reducer and comm hook, the session's
taps, its gradient-mean scheme); replaying the window through that machinery only checks it against
itself. :class:`PlainReference` keeps one plain copy of the unwrapped module per session (made once, no
DDP/FSDP hooks, no tensor hooks; its parameters and buffers are refreshed by copy on each audited step)
and recomputes the window there with plain torch: the same micro-batches, RNG state, autocast, loss and
per-micro-step weight, ``backward()`` accumulating into the copy's ``.grad``. It costs one more set of
parameters and gradients in memory for the session's lifetime (reused, never reallocated per audit).
On CPU the result has the bits of an honest executor's local gradient (same ops, same order);
elsewhere it agrees within the audit's ``bound``.

It applies where every rank holds the whole parameters and nothing else splits the model: plans whose
world is their ``dp_replicate`` (DDP, or one rank). Sharded (FSDP2/HSDP), tensor/pipeline/context
parallel plans keep the executor's own replays (a plain copy would need every shard gathered).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .layouts import pre_wrap_fqn, unwrap

__all__ = ["PlainReference", "reference_applies"]


def reference_applies(plan: Any) -> bool:
    """Whether a plain copy of the module on one rank computes that rank's whole local gradient."""
    return int(plan.world_size) == int(plan.dp_replicate)


def _strip_hooks(module: nn.Module) -> None:
    """No hook of the original (module or tensor) runs on the copy."""
    for sub in module.modules():
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            hooks = getattr(sub, name, None)
            if hooks is not None:
                hooks.clear()
    for tensor in [*module.parameters(), *module.buffers()]:
        tensor._backward_hooks = None
        if getattr(tensor, "_post_accumulate_grad_hooks", None) is not None:
            tensor._post_accumulate_grad_hooks = None  # type: ignore[assignment]  # None is its unset state


class PlainReference:
    """One plain copy of a session's module, reused for every audited window of the session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._copy: nn.Module | None = None
        self._params: list[tuple[str, nn.Parameter, nn.Parameter]] = []

    def build(self) -> nn.Module:
        """The plain copy (made on the first call, before any audit hook is armed; reused after)."""
        if self._copy is None:
            plain = copy.deepcopy(unwrap(self.session.module))
            _strip_hooks(plain)
            mine = dict(self.session.named_trainable())
            self._params = [(pre_wrap_fqn(n), p, mine[pre_wrap_fqn(n)])
                            for n, p in plain.named_parameters() if pre_wrap_fqn(n) in mine]
            self._copy = plain
        return self._copy

    def gradient(self, window: list, rng_restore: Any, buffers: list[torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """The window's local gradient on the plain copy, starting from the session's current parameters,
        ``buffers`` (the window's start) and the RNG state ``rng_restore()`` sets; valid until the next call."""
        session = self.session
        plain = self.build()
        with torch.no_grad():
            for _, p, live in self._params:
                p.copy_(live.detach())
                p.grad = None
            if buffers:
                for b, saved in zip(plain.buffers(), buffers):
                    b.copy_(saved)
        rng_restore()
        scale = float(session._mean.backward_scale)
        for x, y, _sync, weight in window:
            with session._autocast():
                loss_sum, _count = session.loss_fn(plain, x, y)
            (loss_sum * (scale * weight)).backward()
        # the copy's own .grad tensors (no clone): read before the next call, which allocates new ones
        return {name: p.grad.detach() for name, p, _ in self._params if p.grad is not None}
