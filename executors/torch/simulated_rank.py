"""mixle's ``StepResult`` and ``SimulatedRank``: one data-parallel rank's step on a thread, held at a rendezvous.

A step computes the rank's forward and backward on a fresh replica of the canonical weights, then
waits at the gradient rendezvous (where a real rank would all-reduce) until the driver releases it
(it survives the step) or cancels it (a simulated kill). Every wait is bounded: a rank never
released within ``hold_timeout_s`` gives up on its own, and each step's outcome lives in its own
attempt, so a late thread of an abandoned step can never overwrite a newer one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

LocalLoss = Callable[[nn.Module, Any, Any], torch.Tensor]


def cross_entropy_loss(module: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
    """mixle's step loss: the mean cross entropy of ``module(inputs)`` against class targets."""
    return torch.nn.functional.cross_entropy(module(inputs), targets)


def check_positive_seconds(value: Any, name: str) -> float:
    """``value`` as a finite positive float, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_index(value: Any, name: str) -> int:
    """``value`` as an int >= 0 (not a bool), or a TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


@attrs.define(frozen=True, eq=False)
class StepResult:
    """One rank's finished step: mean loss and gradient norm over its ``examples`` rows, and its gradients."""

    rank: int
    step: int
    loss: float
    grad_norm: float
    grads: list[torch.Tensor]
    examples: int = 1


@attrs.define(eq=False)
class _Attempt:
    """The events and outcome of one step of one rank (a fresh one per ``start_step``)."""

    step: int
    on_started: Callable[[int], None] | None
    started: threading.Event = attrs.field(factory=threading.Event)
    go: threading.Event = attrs.field(factory=threading.Event)
    cancelled: threading.Event = attrs.field(factory=threading.Event)
    done: threading.Event = attrs.field(factory=threading.Event)
    result: StepResult | None = None
    error: BaseException | None = None


class SimulatedRank:
    """One data-parallel rank on a background thread, stopped after its backward at the gradient rendezvous.

    ``model_factory()`` builds the replica, ``batch_fn()`` gives ``(inputs, targets)`` for the step;
    ``loss_fn(module, inputs, targets)`` (mixle's cross entropy by default) returns the mean loss.
    """

    def __init__(self, rank_id: int, model_factory: Callable[[], Any], batch_fn: Callable[[], tuple[Any, Any]], *,
                 loss_fn: LocalLoss | None = None, hold_timeout_s: float = 60.0) -> None:
        self.rank_id = check_index(rank_id, "rank_id")
        for name, fn in (("model_factory", model_factory), ("batch_fn", batch_fn)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        self.model_factory, self.batch_fn = model_factory, batch_fn
        self.loss_fn: LocalLoss = loss_fn or cross_entropy_loss
        self.hold_timeout_s = check_positive_seconds(hold_timeout_s, "hold_timeout_s")
        self._attempt: _Attempt | None = None
        self._thread: threading.Thread | None = None

    @property
    def in_flight(self) -> bool:
        """True while a step's thread is still running (computing, or held at the rendezvous)."""
        return self._thread is not None and self._thread.is_alive()

    def start_step(self, step: int, canonical_state_dict: dict[str, Any], *,
                   on_started: Callable[[int], None] | None = None) -> None:
        """Start step ``step`` from ``canonical_state_dict`` on a new thread; ``on_started(rank_id)`` is called
        when the rank reaches the rendezvous (or failed before it)."""
        if self.in_flight:
            raise RuntimeError(f"rank {self.rank_id} still has step {self._attempt.step if self._attempt else '?'} "
                               "in flight; join() or cancel() it first, or respawn the rank")
        attempt = _Attempt(check_index(step, "step"), on_started)
        self._attempt = attempt
        self._thread = threading.Thread(target=self._run, args=(attempt, canonical_state_dict), daemon=True,
                                        name=f"mixle_parallel-simulated-rank-{self.rank_id}-step-{step}")
        self._thread.start()

    def _compute(self, step: int, state: dict[str, Any]) -> StepResult:
        model = self.model_factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model_factory must return a torch.nn.Module, got {type(model).__name__}")
        model.load_state_dict(state)
        x, y = self.batch_fn()
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(f"batch_fn must return (inputs, targets) tensors, got ({type(x).__name__}, "
                            f"{type(y).__name__})")
        if x.dim() < 1 or y.dim() < 1 or x.shape[0] == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(f"batch_fn returned inputs {tuple(x.shape)} and targets {tuple(y.shape)}: both need "
                             "the same non-empty batch dimension")
        model.zero_grad(set_to_none=True)
        loss = self.loss_fn(model, x, y)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("loss_fn must return a scalar tensor (the mean loss of the batch)")
        loss.backward()
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        return StepResult(self.rank_id, step, float(loss.detach()), norm, grads, int(x.shape[0]))

    def _run(self, attempt: _Attempt, state: dict[str, Any]) -> None:
        try:
            computed = self._compute(attempt.step, state)
        except BaseException as err:  # noqa: BLE001 - reported to the driver by join()
            attempt.error = err
            computed = None
        try:
            if attempt.cancelled.is_set():
                return
            attempt.started.set()
            if attempt.on_started is not None:
                attempt.on_started(self.rank_id)
            if computed is None:
                return
            released = attempt.go.wait(self.hold_timeout_s)  # bounded: an unreleased rank gives up
            if released and not attempt.cancelled.is_set():
                attempt.result = computed
        finally:
            attempt.done.set()

    def wait_started(self, timeout: float = 5.0) -> bool:
        """True once this step reached the rendezvous (or failed before it) within ``timeout`` seconds."""
        return self._attempt is not None and self._attempt.started.wait(timeout)

    def release(self) -> None:
        """Let this rank through the rendezvous: it survives this step."""
        if self._attempt is not None:
            self._attempt.go.set()

    def cancel(self) -> None:
        """Abandon this step (a simulated kill): its result is discarded and a rank held at the rendezvous wakes."""
        if self._attempt is not None:
            self._attempt.cancelled.set()
            self._attempt.go.set()

    def join(self, timeout: float = 5.0) -> StepResult | None:
        """The step's result (None when it was cancelled or never released); TimeoutError when the thread is
        still running after ``timeout`` seconds, RuntimeError when the step failed."""
        attempt, thread = self._attempt, self._thread
        if attempt is None or thread is None:
            raise RuntimeError(f"rank {self.rank_id} has no step to join; call start_step() first")
        if not attempt.done.wait(max(0.0, timeout)):
            raise TimeoutError(f"rank {self.rank_id} did not finish step {attempt.step} within {timeout} s")
        thread.join(max(0.0, timeout))  # done is set in the thread's last statement; this is at most a moment
        if attempt.error is not None:
            raise RuntimeError(f"rank {self.rank_id} failed step {attempt.step}: {attempt.error!r}") \
                from attempt.error
        return attempt.result

    def wait_finished(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the step's thread to end; True when none is running."""
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))
        return not self.in_flight

    @property
    def error(self) -> BaseException | None:
        """Why the current step failed before the rendezvous (None when it did not)."""
        return None if self._attempt is None else self._attempt.error


__all__ = ["SimulatedRank", "StepResult"]
