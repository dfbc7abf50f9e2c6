"""The counts of a session's accumulation window (loss sum, examples, tokens) and the all-reduce that
makes them global, started before the commit's backward under DDP (see docs/training.md)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .comm_taps import CommTap


class WindowCounts:
    """This rank's float64 counts since the last commit (``loss``, ``examples``, ``tokens``) and since the last
    receipt (``calls_*``), kept as tensors so a micro-step never waits for the device."""

    def __init__(self, *, tp: int, cp: int, tap: CommTap, comm_device: torch.device) -> None:
        self.tp, self.cp, self.tap, self.comm_device = tp, cp, tap, comm_device
        self._reduce: tuple[Any, torch.Tensor] | None = None
        self._coef: float | None = None
        self.reset()

    def reset(self) -> None:
        """Start a new window (after a commit, a skip or a discard)."""
        zero = lambda: torch.zeros((), dtype=torch.float64)  # noqa: E731
        self.loss, self.tokens, self.examples = zero(), zero(), zero()
        self.calls_loss, self.calls_tokens, self.calls_examples = zero(), zero(), zero()

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

    # ---- the all-reduce started before the commit's backward (DDP) ------------------------------
    @property
    def reducing(self) -> bool:
        """True between ``start_reduce`` and ``finish_reduce``."""
        return self._reduce is not None

    def start_reduce(self, rank_slots: torch.Tensor | None) -> None:
        """Start the window counts' all-reduce over the world (``mean_coef`` and ``finish_reduce`` wait for it)."""
        stats = self.stats(rank_slots).to(self.comm_device)
        work = dist.all_reduce(stats, async_op=True)
        self.tap.add("all_reduce", stats.numel() * stats.element_size())
        self._reduce, self._coef = (work, stats), None

    def mean_coef(self) -> float:
        """1 / the window's global token count (0 when none was counted: the commit then refuses the step)."""
        if self._coef is None:
            if self._reduce is None:
                raise RuntimeError("no window all-reduce was started; call start_reduce() first")
            work, stats = self._reduce
            work.wait()
            tokens = float(stats[2])
            self._coef = 1.0 / tokens if tokens > 0 else 0.0
        return self._coef

    def finish_reduce(self) -> list[float]:
        """The summed window counts (waits for their all-reduce)."""
        if self._reduce is None:
            raise RuntimeError("no window all-reduce was started; call start_reduce() first")
        work, stats = self._reduce
        work.wait()
        self._reduce = None
        return [float(v) for v in stats.cpu().tolist()]
