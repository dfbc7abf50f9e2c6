"""The audit sample of an EM pass: drawn after every group has committed, from fresh entropy, systematically.

A backend that could tell an audited pass (or chunk) from an unaudited one before it hands its results back
could cheat on exactly the others. So the pass hands every group the same tasks, every group commits to a
digest per chunk, and only then does :meth:`SystematicDraw.draw` take fresh entropy (``secrets``, made after
the commitments, so no earlier state of the process holds it) and pick the chunks to audit.

The draw is systematic: passes are grouped into cycles of ``ceil(1 / rate)`` passes, and each pass of a cycle
audits a fresh random share of the chunks not yet audited in that cycle (``ceil(left / passes left)`` of
them), so every chunk is audited once in every cycle: a backend that corrupts one fixed chunk on every pass is
caught within one cycle whatever the entropy. Every pass audits at least one chunk (a pass that audits nothing
would be a free pass to a backend that learnt the schedule), and the first pass of a fit (a new cycle starts
there) audits at least one chunk of every worker.

Each :class:`Draw` records its entropy, so once the pass is over anyone can re-derive the sample
(:func:`recheck_draws`) from the receipts: the entropy of a pass is published only after its own sample was
drawn and is never used again.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

__all__ = ["DRAW_ENTROPY_BYTES", "Draw", "SystematicDraw", "cycle_length", "fresh_entropy", "recheck_draws"]

DRAW_ENTROPY_BYTES = 32
"""Bytes of fresh entropy behind each pass's sample."""


def fresh_entropy() -> bytes:
    """New entropy for one pass's draw (the operating system's CSPRNG)."""
    return secrets.token_bytes(DRAW_ENTROPY_BYTES)


def cycle_length(rate: float) -> int:
    """Passes per cycle at audit ``rate``: ``ceil(1 / rate)`` (every chunk audited once per cycle); 0 for rate 0."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"audit rate={rate} must be within [0, 1]")
    return 0 if rate == 0.0 else math.ceil(1.0 / rate - 1e-12)


@attrs.frozen
class Draw:
    """One pass's audit sample and what re-derives it: the cycle, the pass's place in it, the entropy."""

    cycle: int
    slot: int
    cycle_length: int
    entropy: str
    """Hex of the pass's fresh entropy (published with the pass's receipt, after the draw)."""
    chunks: tuple[int, ...]
    first_of_fit: bool = False
    owners: tuple[int, ...] = ()
    """On a fit's first pass: the worker of each chunk (the draw takes one chunk of each); else empty."""

    def receipt_fields(self) -> dict[str, Any]:
        """This draw as the plain JSON values of a receipt's ``audit_draw``."""
        return {"cycle": self.cycle, "slot": self.slot, "cycle_length": self.cycle_length, "entropy": self.entropy,
                "chunks": list(self.chunks), "first_of_fit": self.first_of_fit, "owners": list(self.owners)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Draw:
        """A :class:`Draw` back from :meth:`receipt_fields` (a receipt read from a ledger)."""
        return cls(int(fields["cycle"]), int(fields["slot"]), int(fields["cycle_length"]), str(fields["entropy"]),
                   tuple(int(c) for c in fields["chunks"]), bool(fields.get("first_of_fit", False)),
                   tuple(int(w) for w in fields.get("owners", ())))


def _pick(entropy: bytes, left: Sequence[int], count: int, num_chunks: int, first_of_fit: bool,
          owners: Sequence[int]) -> tuple[int, ...]:
    """The chunks one pass audits: ``count`` of ``left`` (one of all chunks when none is left), then on a fit's
    first pass one chunk of each worker not yet among them; a pure function of its inputs."""
    seed = int.from_bytes(hashlib.sha256(b"mixle-parallel/em-audit-draw\0" + entropy).digest(), "big")
    rng = np.random.Generator(np.random.PCG64(seed))
    pool = sorted(left) if left else list(range(num_chunks))
    take = min(max(count, 1), len(pool)) if pool else 0
    chosen = {pool[int(i)] for i in rng.permutation(len(pool))[:take]}
    if first_of_fit and owners:
        for worker in sorted(set(owners)):
            mine = [c for c, w in enumerate(owners) if w == worker]
            if not chosen.intersection(mine):
                chosen.add(mine[int(rng.integers(len(mine)))])
    return tuple(sorted(chosen))


class SystematicDraw:
    """The cycle state of one handle's audit: which chunks the current cycle has still to audit.

    It holds no entropy: each :meth:`draw` is given the pass's own, made after the commitments."""

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)
        self.length = cycle_length(self.rate)
        self.cycle = -1
        self.slot = 0
        self._left: set[int] = set()

    def begin_fit(self) -> None:
        """The next draw starts a new cycle (a fit's first pass)."""
        self.slot = self.length

    def state(self) -> tuple[int, int, frozenset[int]]:
        """Where the cycle stands (cycle, slot, chunks left): what :meth:`restore` sets back."""
        return self.cycle, self.slot, frozenset(self._left)

    def restore(self, state: tuple[int, int, frozenset[int]]) -> None:
        """Set the cycle back to ``state`` (a fit that drops passes it ran ahead: ``deferred_judging``)."""
        self.cycle, self.slot, self._left = state[0], state[1], set(state[2])

    def draw(self, entropy: bytes, num_chunks: int, owners: Sequence[int], *, first_of_fit: bool) -> Draw:
        """The sample of the pass whose commitments are in, from its fresh ``entropy``; advances the cycle.

        ``owners`` is the worker of each chunk (used on a fit's first pass). At rate 0 only a fit's first pass
        audits (one chunk per worker)."""
        if len(entropy) < 16:
            raise ValueError(f"a draw needs at least 16 bytes of fresh entropy, got {len(entropy)}")
        if self.length == 0:
            chunks = _pick(entropy, [], 0, num_chunks, True, owners) if first_of_fit else ()
            return Draw(0, 0, 0, entropy.hex(), chunks, first_of_fit, tuple(owners) if first_of_fit else ())
        if first_of_fit or self.cycle < 0 or self.slot >= self.length:
            self.cycle, self.slot, self._left = self.cycle + 1, 0, set(range(num_chunks))
        count = math.ceil(len(self._left) / (self.length - self.slot))
        chunks = _pick(entropy, sorted(self._left), count, num_chunks, first_of_fit, owners)
        out = Draw(self.cycle, self.slot, self.length, entropy.hex(), chunks, first_of_fit,
                   tuple(int(w) for w in owners) if first_of_fit else ())
        self._left.difference_update(chunks)
        self.slot += 1
        return out


def recheck_draws(rate: float, num_chunks: int, draws: Iterable[Draw]) -> None:
    """Re-derive every pass's sample from the recorded entropy, in order; raises ``ValueError`` naming the first
    pass whose recorded chunks, cycle or slot are not what the rule gives (an auditor's check of a run)."""
    state = SystematicDraw(rate)
    for i, recorded in enumerate(draws):
        if state.length and state.cycle >= 0 and not recorded.first_of_fit and recorded.slot == 0 \
                and state.slot < state.length:
            raise ValueError(f"pass {i}: a new cycle started after {state.slot} of {state.length} passes, "
                             "outside a fit's first pass")
        again = state.draw(bytes.fromhex(recorded.entropy), num_chunks, recorded.owners,
                           first_of_fit=recorded.first_of_fit)
        if again != recorded:
            raise ValueError(f"pass {i}: the recorded audit draw {recorded.chunks} (cycle {recorded.cycle}, slot "
                             f"{recorded.slot}) is not the one its entropy gives, {again.chunks} (cycle "
                             f"{again.cycle}, slot {again.slot})")
