"""Rank bodies for the in-session SDC audit under tensor parallelism: tp=2 (world 2), FSDP2 + TP
(dp_shard=2 x tp=2, world 4).

Every rank replays at once: its own window (same rank) and its data-parallel predecessor's (the
rank with the same tp index), so the TP collectives inside the replays line up. Every audited step also
recomputes the window on a plain copy with the full parameters gathered into it, and judges this rank's
shard of its gradient within a tolerance (``sdc_tp_reference``).
"""

from __future__ import annotations

from typing import Any

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.torch import sdc_tp_reference
from mixle_parallel.verification import BitFlip, FaultInjector
from tests.torch._audit_scenarios import cheating, drive, session
from tests.torch._models import TP_PLAN, global_batches

FSDP_TP = ParallelPlan(dp_shard=2, tp=2)
TP2 = ParallelPlan(tp=2)
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
        # FSDP2 + TP cheating outside the harness: its replays agree with it, the plain reference does not
        "cheat": drive(cheating(session(FSDP_TP, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise")),
                       _batches(2, seed=35)),
    }


def _tp_batches(steps: int, seed: int) -> list:
    """Both tp ranks of a tp=2 world see the same batch."""
    return [[per_dp[0]] * TP2.world_size for per_dp in global_batches(steps, [4], seed=seed)]


def world2() -> dict[str, Any]:
    """tp=2: clean audited steps (policy raise) and the same run unaudited, with accumulation too; an executor that
    cheats outside the harness; a gradient flip (a device fault); a module above the reference's one-rank limit."""
    clean, flips = _tp_batches(8, seed=41), _tp_batches(4, seed=42)
    accum = ParallelPlan(tp=2, microbatches=2, gradient_accumulation_steps=2)
    out = {
        "audited": drive(session(TP2, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise"), clean),
        "plain": drive(session(TP2, tp_plan=TP_PLAN, audit=False), clean),
        "accum_audited": drive(session(accum, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise"), clean),
        "accum_plain": drive(session(accum, tp_plan=TP_PLAN, audit=False), clean),
        "cheat": drive(cheating(session(TP2, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise")), flips),
        "flip": drive(session(TP2, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="skip_step", fault_injector=
                              FaultInjector([BitFlip("gradient", "blocks.1.up.weight", rank=1, step=1, index=3,
                                                     bit=28)])), flips),
    }
    freed = session(TP2, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise")
    freed.train_batch(*clean[0][0])
    copy = freed._audit._tp_reference.plain.build()
    # after the audited step the gathered full parameters and the copy's gradients are gone again
    out["freed"] = {"audited": freed._audit.audited_steps, "numel": sum(p.numel() for p in copy.parameters()),
                    "grads": [p.grad for p in copy.parameters() if p.grad is not None]}
    freed.close()
    limit, sdc_tp_reference.MAX_REFERENCE_BYTES = sdc_tp_reference.MAX_REFERENCE_BYTES, 1024
    try:  # the module is "too large for one rank": the reference is skipped and every audited receipt says why
        out["oversized"] = drive(session(TP2, tp_plan=TP_PLAN, audit_rate=1.0, audit_policy="raise"), flips)
    finally:
        sdc_tp_reference.MAX_REFERENCE_BYTES = limit
    return out
