"""Cheap collective accounting and the SDC audit's view of local gradients, at the data-parallel comm layer.

Instead of a dispatch mode over every aten op (``comm_meter.CollectiveMeter``, still used for
tensor and context parallelism), the session taps the only places DDP and FSDP2 communicate:

* DDP: every multi-rank DDP session runs a Python comm hook, owned by the session's gradient-mean
  scheme (``gradient_mean.DDPMean``): it counts each bucket DDP really hands to its communication
  (its buffer's bytes) through this tap, so receipts show what was issued, including an all-reduce on
  a micro-step that should not have synchronized; DDP's forward buffer broadcasts are counted as issued
  (:func:`count_buffer_broadcasts`); the audit and a fault injector arm post-accumulate-grad hooks
  (:class:`DDPGradientAccess`) only on the steps they need.
* FSDP2 / HSDP: custom ``AllGather`` / ``ReduceScatter`` comm objects
  (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``) that call the same
  ``torch.distributed`` functions FSDP2's defaults call, and for HSDP an all-reduce hook
  (``set_all_reduce_hook``) that runs once per replica all-reduce.

Each tap counts the collective and its bytes (the same definition as the meter: all-reduce buffer,
gathered output, full reduce-scatter input), and, for the audit, can *capture* this rank's local
gradient per parameter before it is reduced, *inject* a planned bit flip into it, or *replay*:
capture without communicating (the audit's recomputation must not reach other ranks' gradients).
FSDP2's reduce-scatter input is the unsharded local gradients laid out by ``chunk_cat`` (dim-0
chunks per rank, padded), which ``_unchunk`` inverts exactly; for fp32/bf16 FSDP2 does not
pre-divide it, so the captured values are the raw local gradients. When a parameter of the group got
no gradient (a layer the forward skipped) the input leaves it out; the captured copy is split per
parameter after the reduction, by the parameters FSDP2 then gave a gradient (``CommTap.take``).
"""

from __future__ import annotations

import math
from collections import Counter
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from .comm_meter import CollectiveMeter
from .dp_mode import DataParallelMode
from .layouts import pre_wrap_fqn, unwrap

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Shard
    from torch.nn.parallel import DistributedDataParallel

class TapMode(StrEnum):
    """What the taps do with the local gradients they see."""

    PASS = "pass"
    """Count and communicate; look at nothing."""
    CAPTURE = "capture"
    """Also keep a copy of each local gradient before its reduction (an audited window)."""
    REPLAY = "replay"
    """Keep a copy and do not communicate (the audit's recomputation must not reach other ranks)."""


class CommTap:
    """Shared state of one session's taps: counters, the audit mode, captured gradients, the fault injector."""

    def __init__(self, *, counting: bool, rank: int) -> None:
        self.counting = counting
        self.rank = rank
        self.bytes = 0
        self.counts: Counter[str] = Counter()
        self.mode = TapMode.PASS
        self.captured: dict[str, torch.Tensor] = {}
        self.deferred: list[tuple[TapReduceScatter, int, torch.Tensor]] = []
        """FSDP2 reduce-scatter inputs captured before it was known which parameters they hold (see ``take``)."""
        self.injector: Any = None
        self.step = 0
        self.injected: list[str] = []
        self.syncing = True
        """Whether the running micro-step synchronizes gradients (set by the session before backward)."""
        self.ddp_access: DDPGradientAccess | None = None
        """DDP only, with the audit or a fault injector: the on-demand local-gradient hooks."""

    def reset(self) -> None:
        """Forget what was counted so far."""
        self.bytes = 0
        self.counts.clear()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """(bytes, counts per collective kind) counted so far."""
        return self.bytes, dict(self.counts)

    def add(self, kind: str, nbytes: int, count: int = 1) -> None:
        """Count ``count`` collectives moving ``nbytes`` in all (not while replaying: audit traffic is not counted)."""
        if self.counting and self.mode is not TapMode.REPLAY:
            self.counts[kind] += count
            self.bytes += int(nbytes)

    def wants_flip(self) -> bool:
        """True when a planned gradient flip could strike this rank at this step (cheap pre-check)."""
        injector = self.injector
        if injector is None or self.mode is TapMode.REPLAY:
            return False
        return any(f.kind == "gradient" and f.rank == self.rank and f.step == self.step for f in injector.pending)

    def inject(self, name: str, value: torch.Tensor) -> bool:
        """Apply a planned gradient flip to ``value`` (in place); True when one struck."""
        struck = bool(self.injector.apply("gradient", name, value, rank=self.rank, step=self.step))
        if struck:
            self.injected.append(name)
        return struck

    def take(self) -> dict[str, torch.Tensor]:
        """The captured gradients (and forget them); a flat FSDP2 input that left a parameter out (it got no
        gradient) is split per parameter now, once FSDP2 has given a gradient to exactly those that had one."""
        for owner, world, flat in self.deferred:
            self.captured.update(owner.split_deferred(flat, world))
        out, self.captured, self.deferred = self.captured, {}, []
        return out


def owned(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``view`` as a tensor of its own: a clone only when it still shares ``base``'s memory (a reshape across
    ranks' chunks already copied it; a second copy would only cost time)."""
    return view.clone() if view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() else view


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements (what a collective moves for it)."""
    return t.numel() * t.element_size()


# ---- DDP ---------------------------------------------------------------------------------
class DDPGradientAccess:
    """The audit's and the fault injector's view of DDP's local gradients, armed only for the windows that need it.

    When armed, a post-accumulate-grad hook on each parameter sees ``p.grad`` right after autograd
    accumulated it and before DDP's reducer copies it into its bucket (the reducer runs as a post
    hook of the same AccumulateGrad node, after the tensor's own post-accumulate hooks): on the
    window's synchronizing micro-step it injects a planned flip there (so the flip is what gets
    reduced) and, in ``capture`` mode, clones the local gradient. A replay runs under
    ``no_sync()`` and reads the accumulated ``p.grad`` instead, so it never communicates.
    """

    def __init__(self, tap: CommTap, named_params: list[tuple[str, nn.Parameter]]) -> None:
        self.tap = tap
        self.named_params = named_params
        self._handles: list[Any] = []

    def arm(self) -> None:
        """Register the hooks (idempotent)."""
        if not self._handles:
            self._handles = [p.register_post_accumulate_grad_hook(self._hook(name)) for name, p in self.named_params]

    def disarm(self) -> None:
        """Remove the hooks: later steps cost nothing."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, name: str) -> Any:
        tap = self.tap

        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            if grad is None or not tap.syncing or tap.mode is TapMode.REPLAY:
                return  # only the synchronizing micro-step's accumulated gradient is what DDP reduces
            if tap.wants_flip():
                tap.inject(name, grad)
            if tap.mode is TapMode.CAPTURE:
                tap.captured[name] = grad.detach().clone()

        return hook


# ---- FSDP2 ---------------------------------------------------------------------------------
def managed_parameters(module: nn.Module, prefix: str) -> list[tuple[str, nn.Parameter]]:
    """FSDP2's managed parameters of ``module`` in its order (post-order, nested fully_shard modules skipped)."""
    from torch.distributed.fsdp import FSDPModule

    modules: list[tuple[str, nn.Module]] = []
    visited: set[int] = set()

    def dfs(path: str, current: nn.Module) -> None:
        if current is not module and isinstance(current, FSDPModule):
            return
        visited.add(id(current))
        for child_name, child in current.named_children():
            if id(child) not in visited:
                dfs(f"{path}{child_name}.", child)
        modules.append((path, current))

    dfs(prefix, module)
    out: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for path, current in modules:
        for name, param in current.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                out.append((path + name, param))
    return out


class _Layout:
    """Where each parameter's gradient lies in a reduce-scatter input of ``world`` dim-0 chunks."""

    def __init__(self, params: list[tuple[str, tuple[int, ...]]], world: int) -> None:
        self.world = world
        self.entries: list[tuple[str, tuple[int, ...], int, int, int]] = []  # name, shape, offset, rows, inner
        offset = 0
        for name, shape in params:
            rows = -(-shape[0] // world) if shape else 1
            inner = math.prod(shape[1:]) if len(shape) > 1 else 1
            self.entries.append((name, shape, offset, rows, inner))
            offset += rows * inner
        self.row_numel = offset

    def unchunk(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's unsharded gradient (a copy) from the flat reduce-scatter input."""
        table = flat.view(self.world, -1)
        out = {}
        for name, shape, offset, rows, inner in self.entries:
            padded = table[:, offset:offset + rows * inner].reshape(self.world * rows, *shape[1:])
            out[name] = owned(padded[: shape[0]] if shape else padded.reshape(()), flat)
        return out

    def write_back(self, flat: torch.Tensor, name: str, value: torch.Tensor) -> None:
        """Store ``value`` (one parameter's unsharded gradient) back into the flat input."""
        table = flat.view(self.world, -1)
        for entry_name, shape, offset, rows, inner in self.entries:
            if entry_name == name:
                padded = torch.zeros((self.world * rows, *shape[1:]), dtype=value.dtype, device=value.device)
                padded[: shape[0]] = value
                table[:, offset:offset + rows * inner].copy_(padded.reshape(self.world, rows * inner))
                return


def _pre_fsdp_shape(param: nn.Parameter) -> tuple[int, ...]:
    """The shape FSDP2 shards along dim 0: the global shape with tensor-parallel sharding applied.

    Under FSDP2 + TP a parameter is a DTensor over (dp..., tp); the reduce-scatter input holds this
    rank's TP shard of the gradient, unsharded along the data-parallel dims. TP plans are checked to
    divide every dimension they shard, so the division is exact.
    """
    shape = list(param.shape)
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return tuple(shape)
    placements = cast("DTensor", param).placements  # a parameter with a device mesh is a DTensor
    for index, (name, placement) in enumerate(zip(mesh.mesh_dim_names or (), placements)):
        if name == "tp" and placement.is_shard():
            shape[cast("Shard", placement).dim] //= mesh.size(index)  # is_shard() does not narrow the type
    return tuple(shape)


def _gather_fn() -> Any:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Any, op: Any, async_op: bool) -> Any:
    single = getattr(dist, "reduce_scatter_single", None)
    if single is not None:
        return single(output=output, input=input, group=group, op=op, async_op=async_op)
    return dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


class TapAllGather:
    """FSDP2 all-gather comm: counts the gathered output; always communicates (replays need the parameters)."""

    def __init__(self, tap: CommTap) -> None:
        self.tap = tap

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Plain allocation, as FSDP2's default comm."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        self.tap.add("all_gather", nbytes(output_tensor))
        return _gather_fn()(output_tensor, input_tensor, group=group, async_op=async_op)


class TapReduceScatter:
    """FSDP2 reduce-scatter comm: counts, captures/injects per parameter, skips the collective on replay."""

    def __init__(self, tap: CommTap, params: list[tuple[str, nn.Parameter]], fallback_name: str) -> None:
        self.tap = tap
        self.params = params
        self.fallback_name = fallback_name or "<root>"
        self._layout: _Layout | None = None

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Plain allocation, as FSDP2's default comm."""
        return torch.empty(*size, dtype=dtype, device=device)

    def split_deferred(self, flat: torch.Tensor, world: int) -> dict[str, torch.Tensor]:
        """A flat input captured when some parameter got no gradient, per parameter: FSDP2 lays out exactly the
        parameters it gave a sharded ``.grad`` after this reduction (the session clears them to None between
        windows; a replay clears them first), in its order. The flat buffer as one unit when that does not add up."""
        with_grad = [(n, _pre_fsdp_shape(p)) for n, p in self.params if p.requires_grad and p.grad is not None]
        layout = _Layout(with_grad, world)
        if not with_grad or layout.row_numel * world != flat.numel():
            return {self.fallback_name: flat}
        return layout.unchunk(flat)

    def _layout_for(self, flat: torch.Tensor, world: int) -> _Layout | None:
        if self._layout is None or self._layout.world != world:
            layout = _Layout([(n, _pre_fsdp_shape(p)) for n, p in self.params if p.requires_grad], world)
            self._layout = layout
        if self._layout.row_numel * world != flat.numel():
            return None  # some parameter got no gradient this step: audit the flat buffer as one unit
        return self._layout

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        tap = self.tap
        if tap.mode is not TapMode.PASS or tap.wants_flip():
            world = group.size()
            layout = self._layout_for(input_tensor, world)
            grads = layout.unchunk(input_tensor) if layout else {self.fallback_name: input_tensor.clone()}
            if tap.wants_flip():
                for name, grad in grads.items():
                    if tap.inject(name, grad):
                        if layout:
                            layout.write_back(input_tensor, name, grad)
                        else:
                            input_tensor.copy_(grad)
            if tap.mode is not TapMode.PASS:
                if layout is None:  # which parameters it holds is known after the reduction (take() splits it)
                    tap.deferred.append((self, world, grads[self.fallback_name]))
                else:
                    tap.captured.update(grads)
        if tap.mode is TapMode.REPLAY:
            output_tensor.zero_()  # discarded by the audit; zeros keep FSDP2's bookkeeping finite
            return None
        tap.add("reduce_scatter", nbytes(input_tensor))
        return _reduce_scatter(output_tensor, input_tensor, group, op, async_op)


def fsdp_taps_supported() -> bool:
    """True when FSDP2 offers custom comm objects (torch >= 2.8)."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_custom_reduce_scatter") and hasattr(FSDPModule, "set_custom_all_gather")


def install_fsdp_taps(root: nn.Module, tap: CommTap, *, hsdp: bool) -> None:
    """Install the tapping comms on every FSDP2 module under ``root`` (and the HSDP all-reduce counter)."""
    from torch.distributed.fsdp import FSDPModule

    for path, module in root.named_modules():
        fsdp = module  # narrowed to FSDPModule below; ``module`` stays the nn.Module it also is
        if not isinstance(fsdp, FSDPModule):
            continue
        prefix = f"{path}." if path else ""
        # FSDP2 types the comms as its AllGather / ReduceScatter ABCs; the taps implement them by duck typing
        fsdp.set_custom_all_gather(TapAllGather(tap))  # type: ignore[arg-type]  # duck-typed AllGather
        reduce_scatter = TapReduceScatter(tap, managed_parameters(module, prefix), path)
        fsdp.set_custom_reduce_scatter(reduce_scatter)  # type: ignore[arg-type]  # duck-typed ReduceScatter
        if hsdp:
            fsdp.set_all_reduce_hook(lambda out: tap.add("all_reduce", nbytes(out)))


def count_buffer_broadcasts(ddp: DistributedDataParallel, tap: CommTap) -> None:
    """Count DDP's forward buffer broadcasts as issued: its coalesced broadcast runs under a dispatch-level
    ``CollectiveMeter``, which sees each ``c10d::broadcast_`` it really sends (one per dtype bucket)."""
    original = ddp._distributed_broadcast_coalesced

    def counted(*args: Any, **kwargs: Any) -> Any:
        meter = CollectiveMeter()
        with meter:
            result = original(*args, **kwargs)
        moved, counts = meter.snapshot()
        for kind, n in counts.items():
            tap.add(kind, moved if kind == "broadcast" else 0, n)
        return result

    ddp._distributed_broadcast_coalesced = counted  # type: ignore[method-assign]  # an instance-level wrapper


def install_taps(module: nn.Module, plan: Any, mode: DataParallelMode, *, gradient_access: bool = True) -> CommTap:
    """The session's CommTap, installed on DDP / FSDP2; it counts bytes unless TP or CP need the dispatch meter.

    Under DDP the buckets are counted by the comm hook of the session's ``gradient_mean.DDPMean``,
    which calls ``tap.add``; here DDP's forward buffer broadcasts are counted, and with
    ``gradient_access`` (audit or fault injection) the tap gets a ``DDPGradientAccess`` armed only
    for the steps that need it.
    """
    counting = plan.world_size > 1 and plan.tp == 1 and plan.cp == 1
    if mode.uses_fsdp and not fsdp_taps_supported():
        counting = False  # older FSDP2: the dispatch-mode meter counts; the audit is refused (see torch.sdc_audit)
    tap = CommTap(counting=counting, rank=dist.get_rank() if dist.is_initialized() else 0)
    if mode.uses_ddp:
        count_buffer_broadcasts(cast("DistributedDataParallel", module), tap)
        if gradient_access:
            named = [(pre_wrap_fqn(n), p) for n, p in unwrap(module).named_parameters() if p.requires_grad]
            tap.ddp_access = DDPGradientAccess(tap, named)
    elif mode.uses_fsdp and fsdp_taps_supported():
        install_fsdp_taps(module, tap, hsdp=mode is DataParallelMode.HSDP)
    return tap
