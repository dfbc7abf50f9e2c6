"""Rank bodies for the in-session SDC audit under FSDP2 + tensor parallelism (dp_shard=2 x tp=2, world 4).

Every rank replays at once: its own window (same rank) and its data-parallel predecessor's (the
rank with the same tp index), so the TP collectives inside the replays line up.
"""

from __future__ import annotations

from typing import Any

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification import BitFlip, FaultInjector
from tests.torch._audit_scenarios import cheating, drive, session
from tests.torch._models import TP_PLAN, global_batches

FSDP_TP = ParallelPlan(dp_shard=2, tp=2)
HSDP = ParallelPlan(dp_replicate=2, dp_shard=2)


def _batches(steps: int, seed: int) -> list:
    """Per-rank batches: the two tp ranks of a data-parallel shard see the same batch."""
    dp = global_batches(steps, [4, 4], seed=seed)
    return [[per_dp[FSDP_TP.coordinate(r).dp_shard] for r in range(FSDP_TP.world_size)] for per_dp in dp]


def world4() -> dict[str, Any]:
    """Clean audited steps (policy raise), the same run unaudited, a TP-shard gradient flip kept out; HSDP clean and
    cheating runs."""
    clean = _batches(12, seed=31)
    flip = BitFlip("gradient", "blocks.0.up.weight", rank=3, step=2, index=1, bit=21)
    return {
        "audited": drive(session(FSDP_TP, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise"), clean),
        "plain": drive(session(FSDP_TP, tp_plan=TP_PLAN, audit=False), clean),
        "flip": drive(session(FSDP_TP, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="skip_step",
                              fault_injector=FaultInjector([flip])), _batches(5, seed=32)),
        # HSDP: the plain-copy reference (full parameters gathered) agrees with an honest run and catches a cheat
        "hsdp_audited": drive(session(HSDP, audit_rate=1.0, audit_policy="raise"),
                              global_batches(4, [4, 3, 5, 4], seed=33)),
        "hsdp_plain": drive(session(HSDP, audit=False), global_batches(4, [4, 3, 5, 4], seed=33)),
        "hsdp_cheat": drive(cheating(session(HSDP, audit_rate=1.0, audit_policy="raise")),
                            global_batches(2, [4, 4, 4, 4], seed=34)),
    }
