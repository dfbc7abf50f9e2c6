"""Which steps (or EM passes) an SDC audit replays, and the error raised when one disagrees.

Shared by the training audit (``sdc.training``) and the EM audit (``sdc.em``): the sampling is a
seeded hash of (seed, step), so every rank and every backend picks the same steps without talking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

from ...contracts import TRAINING_AUDIT_POLICIES, SDCAuditRecord

AUDIT_POLICIES = TRAINING_AUDIT_POLICIES
"""What a training audit does on a mismatch (``contracts.TRAINING_AUDIT_POLICIES``; the earlier public name)."""

TRAINING_AUDIT_RATE = 0.04
"""Fraction of steps a training session's audit replays by default (plus the run's first step). An audited step
recomputes a whole window on a plain copy, about 2.1 unaudited DDP steps in all (benchmarks/sdc_audit_overhead.py),
so a run costs about ``1 + rate x 1.1``: 1.044x at 0.04, within the 1.05x budget; at 0.05 DDP sits on it (1.055x).
A persistent defect is still audited within 100 steps with probability 1 - 0.96^100 = 98.3%."""

EM_AUDIT_RATE = 0.05
"""Fraction of EM chunks (or passes) audited by default: the EM audit recomputes a sample of chunks, not whole
steps, so it keeps the higher rate; also ``AuditSchedule``'s default (plus the run's first step)."""

DEFAULT_AUDIT_RATE = EM_AUDIT_RATE
"""The earlier public name of :data:`EM_AUDIT_RATE` (exported by ``verification.sdc``); kept as an alias."""


class SDCDetectedError(RuntimeError):
    """An audit found a corrupted result and the policy is ``raise``; ``records`` says where."""

    def __init__(self, records: Sequence[SDCAuditRecord]) -> None:
        self.records = tuple(records)
        bad = [r for r in self.records if not r.matched]
        where = ", ".join(f"{r.unit} at step {r.step} on rank {r.attributed_rank}" for r in bad)
        super().__init__(
            f"silent data corruption detected: {where}; the update was kept out of the optimizer. "
            "Quarantine the rank's device and resume from the last checkpoint"
        )


class BackendDefectError(SDCDetectedError):
    """A result disagreed with the independent reference and a replay on the same rank reproduced it: the
    backend computes it wrong deterministically (software), so no device is to blame or quarantine."""

    def __init__(self, records: Sequence[SDCAuditRecord]) -> None:
        super().__init__(records)
        bad = [r for r in self.records if not r.matched]
        where = ", ".join(f"{r.unit} at step {r.step} on rank {r.attributed_rank}" for r in bad)
        self.args = (
            f"backend defect: {where} disagrees with the independent reference and a replay on the same rank "
            "reproduced it, so the backend computes it wrong every time (not a device fault). Fix or "
            "re-certify the backend (mixle-parallel certify), or run on a built-in backend",
        )


def audit_uniform(seed: int, step: int, salt: str = "train") -> float:
    """A deterministic number in [0, 1) for (seed, step): every rank computes the same one."""
    raw = hashlib.sha256(f"mixle-parallel-audit:{salt}:{seed}:{step}".encode()).digest()
    return int.from_bytes(raw[:8], "big") / 2.0**64


@attrs.frozen
class AuditSchedule:
    """Which steps are audited: a seeded ``rate`` fraction, plus ``first_step`` (at least one per run)."""

    rate: float = attrs.field(default=EM_AUDIT_RATE)
    seed: int = 0
    first_step: int | None = 0

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"AuditSchedule.rate={self.rate} must be within [0, 1]")

    def is_audited(self, step: int) -> bool:
        """True when ``step`` is audited (identical on every rank that shares the seed)."""
        return step == self.first_step or audit_uniform(self.seed, step) < self.rate

    def audited_steps(self, start: int, stop: int) -> tuple[int, ...]:
        """The audited steps in ``range(start, stop)``."""
        return tuple(s for s in range(start, stop) if self.is_audited(s))
