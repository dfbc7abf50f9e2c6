"""The exact global-mean gradient of a window: its counts, and the scheme that makes the mean.

Every micro-step back-propagates its loss *sum*; the committed gradient is the window's sum over
every rank divided by the global count of targets N. ``WindowCounts`` keeps this rank's counts
(float64, on the CPU). A scheme decides how the backward is scaled, where the counts are
all-reduced and what the commit still has to do (docs/training.md, "Gradients: the exact global
mean"):

* ``MeanAtCommit`` (FSDP2, HSDP, TP, CP, one process): each backward is scaled by D, the group
  DDP/FSDP2 average over, so their averaging cancels; at the commit one float64 all-reduce sums
  the counts and the gradients' squared norm, and the commit scales by 1/N.
* ``DDPMean`` (DDP): the one owner of DDP's comm hook; the backward is not scaled and the hook
  never divides by the group size. Counts before the backward (the CPU): the window's counts are
  all-reduced, without waiting, as the commit micro-step's backward starts, and the hook multiplies
  each bucket by 1/N before its all-reduce (the gradients are still in cache), so the reduced
  gradients are the global mean, the same on every rank, and the commit sends nothing. Counts at
  the commit (CUDA, where reading the count in the hook would stall the host on the device): the
  buckets are all-reduced as they are (sums) and the commit goes as ``MeanAtCommit``'s, with one
  all-reduce. Either way the hook takes each reduced bucket's squared norm, so the gradients' norm
  costs no pass of the session's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ...contracts import ParallelPlan
from .comm_taps import CommTap, nbytes
from .commit import WindowTotals
from .grads import local_grads, weighted_square_sum

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPMean", "MeanAtCommit", "WindowCounts"]


def _zero() -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64)


class WindowCounts:
    """This rank's float64 counts since the last commit (``loss``, ``examples``, ``tokens``) and since the last
    receipt (``calls_*``), kept as tensors so a micro-step never waits for the device."""

    def __init__(self, *, tp: int, cp: int) -> None:
        self.tp, self.cp = tp, cp
        self.reset()

    def reset(self) -> None:
        """Start a new window (after a commit, a skip or a discard)."""
        self.loss, self.tokens, self.examples = _zero(), _zero(), _zero()
        self.calls_loss, self.calls_tokens, self.calls_examples = _zero(), _zero(), _zero()

    def reset_calls(self) -> None:
        """Forget the counts since the last receipt (a receipt of a call that did not commit was made)."""
        self.calls_loss.zero_(), self.calls_tokens.zero_(), self.calls_examples.zero_()

    def add(self, loss_sum: torch.Tensor, counted: Any, rows: int) -> None:
        """Count one weighted micro-step: its loss sum, its counted targets and its rows."""
        count_t = torch.as_tensor(counted, dtype=torch.float64).detach().cpu()
        loss_t = loss_sum.detach().to(torch.float64).cpu()
        self.loss += loss_t
        self.tokens += count_t
        self.examples += rows
        self.calls_tokens += count_t
        self.calls_examples += rows
        self.calls_loss += loss_t

    def stats(self, rank_slots: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's window counts to sum over the world: loss sum, examples, tokens, a non-finite-loss flag,
        then ``rank_slots`` (health's per-rank step times). TP (and, for examples, CP) ranks hold copies of the
        same counts, so they are divided out."""
        tp, cp = self.tp, self.cp
        nonfinite = 0.0 if bool(torch.isfinite(self.loss)) else 1.0
        stats = torch.tensor([float(self.loss) / tp, float(self.examples) / (tp * cp), float(self.tokens) / tp,
                              nonfinite], dtype=torch.float64)
        return stats if rank_slots is None else torch.cat([stats, rank_slots])


def _comm_device(device: torch.device) -> torch.device:
    """Where small control tensors for collectives live: the device on CUDA, else the CPU."""
    return device if device.type == "cuda" else torch.device("cpu")


def reduce_at_commit(counts: WindowCounts, params: list[torch.nn.Parameter], rank_slots: torch.Tensor | None, *,
                     world: int, tap: CommTap, device: torch.device, square: torch.Tensor | None = None,
                     ) -> WindowTotals:
    """One all-reduce over the world of the window's counts and the gradients' squared norm: this rank's
    ``square``, or its local shards' weighted by 1 / their number of copies, so the sum is the squared global norm."""
    square_t = weighted_square_sum(local_grads(params), world) if square is None else square
    stats = torch.cat([counts.stats(rank_slots), square_t.to(device="cpu", dtype=torch.float64)[None]])
    if world > 1:
        stats = stats.to(_comm_device(device))
        dist.all_reduce(stats)
        tap.add("all_reduce", nbytes(stats))
    values = stats.cpu().tolist()
    return WindowTotals.from_values(values[:-1], values[-1], grads_are_means=False)


class MeanAtCommit:
    """Backward scaled by D (DDP/FSDP2's averaging cancels); the counts and the squared norm all-reduced at
    the commit, which then scales by 1/N. Every plan but DDP."""

    def __init__(self, plan: ParallelPlan, tap: CommTap, device: torch.device) -> None:
        # DDP / FSDP2 / HSDP average gradients over every data axis (dp_replicate, dp_shard, cp)
        self.backward_scale = float(plan.dp_replicate * plan.dp_shard * plan.cp)
        self.world, self.tap, self.device = plan.world_size, tap, device

    def before_backward(self, counts: WindowCounts, *, sync: bool, rank_slots: torch.Tensor | None) -> None:
        """Nothing happens before the backward: the counts travel at the commit."""

    def totals(self, counts: WindowCounts, params: list[torch.nn.Parameter],
               rank_slots: torch.Tensor | None) -> WindowTotals:
        """The window's global totals: one all-reduce of counts and squared norm."""
        return reduce_at_commit(counts, params, rank_slots, world=self.world, tap=self.tap, device=self.device)

    def abandon(self) -> None:
        """A window ended without a commit: nothing is in flight."""


class DDPMean:
    """DDP's exact global mean, in one place: the comm hook (its byte count, its factor, the buckets' norms) and
    whether the window's counts are all-reduced as the commit micro-step's backward starts or at the commit."""

    def __init__(self, ddp: DistributedDataParallel, plan: ParallelPlan, tap: CommTap, device: torch.device, *,
                 counts_before_backward: bool) -> None:
        self.world, self.tap, self.device = plan.world_size, tap, device
        self.counts_before_backward = counts_before_backward
        self.backward_scale = 1.0  # the hook never divides by the group size: the buckets are summed
        self._reduce: tuple[Any, torch.Tensor] | None = None
        self._coef: float | None = None
        self._squares: dict[int, torch.Tensor] = {}
        """Each bucket's squared norm once reduced, by bucket index: the gradients' norm with no pass of ours."""
        ddp.register_comm_hook(ddp.process_group, self._hook())

    def before_backward(self, counts: WindowCounts, *, sync: bool, rank_slots: torch.Tensor | None) -> None:
        """A synchronizing micro-step's backward is about to start: its buckets report their norms afresh, and
        (counts before the backward) the window's counts start their all-reduce, which the hook waits for."""
        if not sync:
            return
        self._squares.clear()
        if self.counts_before_backward:
            stats = counts.stats(rank_slots).to(_comm_device(self.device))
            work = dist.all_reduce(stats, async_op=True)
            self.tap.add("all_reduce", nbytes(stats))
            self._reduce, self._coef = (work, stats), None

    def totals(self, counts: WindowCounts, params: list[torch.nn.Parameter],
               rank_slots: torch.Tensor | None) -> WindowTotals:
        """The window's global totals. Counts before the backward: the reduced gradients are already the global
        mean and the same on every rank, so the local norm is the global one and nothing is sent."""
        square = self._square()
        if self._reduce is None:  # the gradients are sums, the same on every rank: each rank adds 1/world of it
            return reduce_at_commit(counts, params, rank_slots, world=self.world, tap=self.tap, device=self.device,
                                    square=square / self.world)
        values = self._finish()
        return WindowTotals.from_values(values, float(square), grads_are_means=True)

    def abandon(self) -> None:
        """A commit that stopped early (an audit skip, a failed replay): finish the started all-reduce."""
        if self._reduce is not None:
            self._finish()

    def _mean_coef(self) -> float:
        """1 / the window's global token count (0 when none was counted: the commit then refuses the step)."""
        if self._coef is None:
            if self._reduce is None:
                raise RuntimeError("the window's counts were not all-reduced before the backward")
            work, stats = self._reduce
            work.wait()
            tokens = float(stats[2])
            self._coef = 1.0 / tokens if tokens > 0 else 0.0
        return self._coef

    def _finish(self) -> list[float]:
        """The summed window counts (waits for their all-reduce); the hook's scaling ends here."""
        assert self._reduce is not None  # callers check
        work, stats = self._reduce
        work.wait()
        self._reduce = None
        return [float(v) for v in stats.cpu().tolist()]

    def _square(self) -> torch.Tensor:
        """The reduced gradients' squared norm: the sum of the buckets' (float64, on the buckets' device)."""
        if not self._squares:
            raise RuntimeError("no DDP bucket was reduced in the commit's backward")
        return torch.stack(list(self._squares.values())).sum()

    def _hook(self) -> Any:
        """The DDP comm hook: count the bucket DDP really communicates, scale it by 1/N when the counts came
        before the backward, all-reduce it (a sum: no division by the group size), and once reduced take its
        squared norm (while later buckets are still in flight)."""
        def reduced(index: int, fut: Any) -> torch.Tensor:
            tensor = fut.value()[0]
            self._squares[index] = torch.linalg.vector_norm(tensor).to(torch.float64).square()
            return tensor

        def hook(state: Any, bucket: Any) -> Any:
            buffer, index = bucket.buffer(), bucket.index()
            self.tap.add("all_reduce", nbytes(buffer))
            if self._reduce is not None:  # counts before the backward: the bucket's share of the global mean
                buffer.mul_(self._mean_coef())
            return dist.all_reduce(buffer, group=state, async_op=True).get_future().then(
                lambda fut: reduced(index, fut))

        # DDP checks the hook's annotations as objects; this module's postponed annotations are strings
        hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                "return": torch.futures.Future[torch.Tensor]}
        return hook
