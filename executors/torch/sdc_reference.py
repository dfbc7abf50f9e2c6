"""The SDC audit's independent reference for training: an audited window's gradient on a plain copy of the module.

The executor computes a gradient through its own machinery (DDP's reducer and comm hook, FSDP2's
all-gathers and reduce-scatter, the session's taps, its gradient-mean scheme); replaying the window
through that machinery only checks it against itself. :class:`PlainReference` keeps one plain copy of
the unwrapped module per session (made once, no DDP/FSDP hooks, no tensor hooks) and recomputes the
window there with plain torch: the same micro-batches, RNG state, autocast, loss and per-micro-step
weight, ``backward()`` accumulating into the copy's ``.grad``. On CPU the result has the bits of an
honest executor's local gradient (same ops, same order); elsewhere it agrees within the audit's ``bound``.

Where every rank holds the whole parameters (DDP, one rank) the copy is a ``deepcopy`` of the module and
keeps its parameters for the session's lifetime (one more set of parameters and gradients in memory):
``load()`` copies the live parameters in right after each update that precedes an audited step, and the
audit's at-rest check compares the live parameters with that copy bit for bit (``matches_live``) instead of
hashing them twice. Under FSDP2/HSDP the copy is made by ``prepare`` before the module is sharded
(``reference_template``: the module's structure with empty parameters, no second copy of the weights);
``load()`` gathers every parameter's full tensor into it for the audited step (a collective: every rank
calls it) and ``release()`` frees them again, so the full parameters exist only while a window is audited.
Tensor-parallel sessions use the copy the same way (template taken before TP splits the module, full
tensors gathered per audited step), but their local gradient is a shard computed with collectives in another
summation order, which the copy does not reproduce bitwise: ``sdc_tp_reference`` judges it within a tolerance.
Pipeline and context-parallel plans keep the executor's own replays.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .comm_taps import owned
from .layouts import pre_wrap_fqn, unwrap

__all__ = ["PlainReference", "reference_applies", "reference_template", "same_bits"]


def reference_applies(plan: Any) -> bool:
    """Whether a plain copy of the module on one rank computes that rank's whole local gradient: every axis
    but the data-parallel ones (dp_replicate, dp_shard) is 1."""
    return int(plan.world_size) == int(plan.dp_replicate) * int(plan.dp_shard) and plan.ep == 1 and plan.etp == 1


def reference_template(module: nn.Module, device: torch.device) -> nn.Module:
    """A plain structural copy of ``module`` taken before it is sharded: its parameters are empty placeholders
    on ``device`` (``PlainReference.load`` gathers the full tensors in), its buffers copies, no hooks."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(torch.empty(0, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
    plain = copy.deepcopy(module, memo).to(device)
    _strip_hooks(plain)
    return plain


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


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s raw bits as integers of its width (bitwise equality: -0.0 != 0.0, NaN payloads count)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    return t.view(width) if width is not None and t.dtype != width else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (shape, dtype and every byte; -0.0 != 0.0, NaN payloads count)."""
    return a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _dim0_shards(params: list[Any]) -> tuple[Any, int] | None:
    """(mesh, mesh dim) when every parameter is a dim-0 shard over that one mesh dim (replicated over any other)
    with the same mesh, placements and dtype: FSDP2's and HSDP's layout; None otherwise."""
    if not params or not all(hasattr(p, "device_mesh") and p.dim() > 0 for p in params):
        return None
    first = params[0]
    mesh, placements = first.device_mesh, tuple(first.placements)
    shard = [i for i, pl in enumerate(placements) if pl.is_shard() and getattr(pl, "dim", None) == 0]
    rest_replicated = all(pl.is_replicate() for i, pl in enumerate(placements) if i not in shard)
    same = all(p.device_mesh is mesh and tuple(p.placements) == placements and p.dtype == first.dtype for p in params)
    return (mesh, shard[0]) if len(shard) == 1 and rest_replicated and same else None


_SEQUENTIAL_GATHER_NOTICE = "While redistributing from "
"""How torch's DTensor redistribution starts its notice that it will issue one all_gather per mesh dimension."""


class _DropSequentialGatherNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_SEQUENTIAL_GATHER_NOTICE)


@contextlib.contextmanager
def quiet_sequential_gather_notice() -> Iterator[None]:
    """Drop torch's "N sequential all_gather operations" notice, only while our own ``full_tensor()`` calls run.

    Gathering a parameter sharded over FSDP2 and TP (``(_StridedShard, Shard)``) to a replica takes one
    all_gather per mesh dimension, which DTensor logs as suboptimal and as "inconsistent between ranks due to
    different reduction orders". An all_gather reduces nothing, so its bits are the same on every rank; the
    audit's reference gathers the full parameters once per audited step on purpose, and the notice (once per rank)
    is noise in a healthy run's output. Any other message of that logger, and the notice from any other call,
    is left alone."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    drop = _DropSequentialGatherNotice()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def gather_full(params: list[Any]) -> list[torch.Tensor]:
    """The full tensors of FSDP2-sharded parameters, with torch.distributed's own all-gather (not the executor's
    comm objects): one flat all-gather over the shard group when every parameter is a dim-0 shard of the same
    mesh and dtype (FSDP2's layout: rank r holds ``chunk(r)`` of dim 0), else ``full_tensor()`` each."""
    import torch.distributed as dist

    layout = _dim0_shards(params)
    if layout is None:
        with quiet_sequential_gather_notice():
            return [p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in params]
    mesh, dim = layout
    world, group = mesh.size(dim), mesh.get_group(dim)
    rows = [-(-p.shape[0] // world) for p in params]
    inner = [math.prod(p.shape[1:]) for p in params]
    locals_ = [p.detach().to_local().reshape(-1) for p in params]
    flat = torch.zeros(sum(r * i for r, i in zip(rows, inner)), dtype=locals_[0].dtype, device=locals_[0].device)
    offset = 0
    for local, r, i in zip(locals_, rows, inner):
        flat[offset:offset + local.numel()].copy_(local)
        offset += r * i
    table = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(table, flat, group=group)
    rows_table = table.view(world, -1)
    out, offset = [], 0
    for p, r, i in zip(params, rows, inner):
        block = rows_table[:, offset:offset + r * i].reshape(world * r, *p.shape[1:])
        out.append(owned(block[: p.shape[0]], table))
        offset += r * i
    return out


class PlainReference:
    """One plain copy of a session's module, reused for every audited window of the session."""

    def __init__(self, session: Any, template: nn.Module | None = None) -> None:
        self.session = session
        self.sharded = bool(session.dp_mode.uses_fsdp) or int(session.plan.tp) > 1
        if self.sharded and template is None:
            raise ValueError("a sharded (FSDP2/HSDP/TP) session's plain reference needs the template prepare() takes "
                             "before sharding (sdc_reference.reference_template)")
        self._template = template
        self._copy: nn.Module | None = None
        self._params: list[tuple[str, nn.Parameter, nn.Parameter]] = []
        self._names: frozenset[str] = frozenset()
        self.loaded = False

    def build(self) -> nn.Module:
        """The plain copy (made on the first call, before any audit hook is armed; reused after)."""
        if self._copy is None:
            if self._template is not None:
                plain = self._template
            else:
                plain = copy.deepcopy(unwrap(self.session.module))
                _strip_hooks(plain)
            # every parameter is loaded (a frozen one too: the forward needs it); gradients are the trainable ones
            live = {pre_wrap_fqn(n): p for n, p in unwrap(self.session.module).named_parameters()}
            self._params = [(pre_wrap_fqn(n), p, live[pre_wrap_fqn(n)])
                            for n, p in plain.named_parameters() if pre_wrap_fqn(n) in live]
            trainable = {name for name, _ in self.session.named_trainable()}
            self._names = frozenset(name for name, _, _ in self._params if name in trainable)
            self._copy = plain
        return self._copy

    @property
    def names(self) -> frozenset[str]:
        """The trainable parameters the copy computes gradients for (pre-wrap names)."""
        self.build()
        return self._names

    def load(self) -> None:
        """The live parameters into the copy: a copy (replicated), or every full tensor gathered (sharded;
        collective, in the same order on every rank)."""
        self.build()
        with torch.no_grad():
            if self.sharded:
                for (_, p, _), full in zip(self._params, gather_full([live for _, _, live in self._params])):
                    p.data = full
            else:
                for _, p, live in self._params:
                    p.copy_(live.detach())
        self.loaded = True

    def matches_live(self) -> bool:
        """True when every loaded parameter still has the live parameter's bits (replicated sessions)."""
        return self.loaded and all(same_bits(p, live.detach()) for _, p, live in self._params)

    def release(self) -> None:
        """Sharded: drop the gathered full parameters and the copy's gradients (memory only while auditing)."""
        if self.sharded and self._copy is not None:
            for _, p, _ in self._params:
                p.data, p.grad = torch.empty(0, dtype=p.dtype, device=p.device), None
            self.loaded = False

    def gradient(self, window: list, rng_restore: Any, buffers: list[torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """The window's local gradient on the copy, from its loaded parameters, ``buffers`` (the window's start)
        and the RNG state ``rng_restore()`` sets; valid until the next call."""
        session = self.session
        plain = self.build()
        if not self.loaded:
            if self.sharded:  # pragma: no cover - the audit loads (a collective) before any recomputation
                raise RuntimeError("the sharded plain reference was not loaded for this window")
            self.load()
        with torch.no_grad():
            for _, p, _ in self._params:
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
        return {name: p.grad.detach() for name, p, _ in self._params if p.grad is not None and name in self._names}
