"""The phase of a training step in which each traced collective was issued, observed by the harness itself.

The harness attributes every flight-recorder entry to a declared update (``attribution``) partly by
*when* it was issued. ``PhaseTracker`` needs no cooperation from the executor: while active it wraps
``nn.Module.__call__`` (hooks included), ``torch.autograd.backward`` / ``torch.autograd.grad`` and
registers global ``Optimizer.step`` hooks, and at each change of the innermost phase notes the flight
recorder's last record id. An entry then belongs to the phase in effect when it was recorded:

* ``forward``: inside a module call (FSDP2's pre-forward all-gathers, TP's output all-reduces, ring attention);
* ``backward``: inside the step's last call of autograd's backward (DDP's bucket all-reduces, FSDP2's
  reduce-scatters and re-gathers); ``backward_early`` inside an earlier one (a non-commit micro-step
  under gradient accumulation, where gradient reductions must be skipped);
* ``optimizer``: inside ``Optimizer.step``;
* ``other``: anything else in the step (a commit's metric all-reduce, hand-written reduction loops,
  pipeline schedules' point-to-point calls between stage computations).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

PHASES = ("forward", "backward_early", "backward", "optimizer", "other")
"""Every phase an entry can be attributed to (``other``: outside the three instrumented calls)."""


class PhaseTracker:
    """Records phase changes against the flight recorder's record ids; ``phase_of(record_id)`` answers later."""

    def __init__(self, last_record_id: Callable[[], int]) -> None:
        self._last_id = last_record_id
        self._stack: list[str] = []
        self._marks: list[int] = []
        self._phases: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []
        self.backward_calls = 0
        """Outermost backward calls so far (the micro-steps of a step under gradient accumulation)."""

    def current(self) -> str:
        """The raw phase token in effect now (``backward:<i>`` for the i-th backward); see ``resolve``."""
        return self._stack[-1] if self._stack else "other"

    def resolve(self, token: str) -> str:
        """A raw token as a phase name of ``PHASES``, once the step is over (``backward_early`` before the last)."""
        if token.startswith("backward:"):
            return "backward" if int(token.split(":", 1)[1]) == self.backward_calls - 1 else "backward_early"
        return token

    def phase_of(self, record_id: int) -> str:
        """The phase (``PHASES``) in effect when the entry ``record_id`` was recorded; call after the step."""
        index = bisect.bisect_left(self._marks, record_id) - 1
        return self.resolve(self._phases[index]) if index >= 0 else "other"

    def _push(self, phase: str) -> None:
        before = self.current()
        if phase == "backward":
            if before.startswith("backward:"):
                phase = before  # a backward inside a backward (a hook's autograd.grad) is the same micro-step
            else:
                phase = f"backward:{self.backward_calls}"
                self.backward_calls += 1
        self._stack.append(phase)
        if phase != before:
            self._note()

    def _pop(self) -> None:
        before = self._stack.pop()
        if self.current() != before:
            self._note()

    def _note(self) -> None:
        self._marks.append(self._last_id())
        self._phases.append(self.current())

    def _scoped(self, phase: str, function: Any) -> Any:
        tracker = self

        def scoped(*args: Any, **kwargs: Any) -> Any:
            tracker._push(phase)
            try:
                return function(*args, **kwargs)
            finally:
                tracker._pop()

        return scoped

    def _patch(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, self._scoped(phase, original))

    def __enter__(self) -> PhaseTracker:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._patch(torch.nn.Module, "__call__", "forward")
        self._patch(torch.autograd, "backward", "backward")
        self._patch(torch.autograd, "grad", "backward")
        self._handles = [register_optimizer_step_pre_hook(lambda *_: self._push("optimizer")),
                         register_optimizer_step_post_hook(lambda *_: self._pop())]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        self._stack.clear()
