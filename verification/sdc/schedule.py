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

DEFAULT_AUDIT_RATE = 0.05
"""Default fraction of steps audited (plus the run's first step, so every run audits one)."""

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

    rate: float = attrs.field(default=DEFAULT_AUDIT_RATE)
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
