"""One rank of the demo's training phase: a tiny transformer LM under a certificate, with SDC audit.

Run in every rank of the world ``mixle_parallel.demo.run`` starts with the one spawner
(``verification.harness.mesh.run_world``); torch is imported inside the rank, never by the facade.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEMO_MODEL = dict(vocab=64, d_model=64, heads=4, layers=2, seq_len=32, batch=16)
"""The demo LM: small enough for 50 steps on 4 CPU ranks in well under a minute."""


def demo_workload(steps: int) -> Any:
    """The built-in synthetic corpus and model (verification's TinyLMWorkload, larger)."""
    from mixle_parallel.verification import TinyLMWorkload

    return TinyLMWorkload(steps=steps, lr=0.05, **DEMO_MODEL)


def train_rank(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any] | None:
    """Train ``config['steps']`` steps in a started process world; rank 0 reports progress, writes the
    receipts and the ledger, and returns the summary (the other ranks return None)."""
    from mixle_parallel import ParallelPlan, load_certificate, to_dict
    from mixle_parallel.executors import get_training_backend
    from mixle_parallel.verification import Ledger
    from mixle_parallel.verification.harness.mesh import report

    plan = ParallelPlan.from_mapping(config["plan"])
    workload = demo_workload(config["steps"])
    certificate = load_certificate(config["certificate"])
    ledger = Ledger(config["ledger"]) if rank == 0 else None
    session = get_training_backend("torch_native").prepare(
        workload.build_module(config["seed"]), plan=plan, optimizer="adamw", lr=3e-3,
        tp_plan=workload.tp_plan(), seed=config["seed"], admission=certificate,
        **config.get("session_options", {}), **({"ledger": ledger} if ledger is not None else {}),
    )
    receipts = Path(config["receipts"]).open("a", encoding="utf-8") if rank == 0 else None
    losses: list[float] = []
    records: list[dict[str, Any]] = []
    try:
        for step in range(config["steps"]):
            inputs, targets = workload.local_batch(step, config["seed"], plan, rank)
            receipt = session.train_batch(inputs, targets)
            records += receipt.extra.get("sdc_audit", ())
            if receipts is not None:
                losses.append(receipt.loss)
                receipts.write(json.dumps(to_dict(receipt), sort_keys=True) + "\n")
                report((step + 1, receipt.loss))
        if config.get("checkpoints"):  # the final checkpoint, with its signed provenance beside it
            session.save_checkpoint(config["checkpoints"], provenance=True,
                                    data=f"built-in synthetic corpus {DEMO_MODEL}, seed {config['seed']}")
        session.close()
    finally:
        if receipts is not None:
            receipts.close()
    if rank != 0:
        return None
    return {"first_loss": losses[0], "last_loss": losses[-1], "steps": len(losses), **audit_counts(records)}


def audit_counts(records: Any) -> dict[str, Any]:
    """How many audit records (dicts or ``SDCAuditRecord``s) there were, how many compared bitwise (bound 0: a
    peer's replay, EM's reference), how many within a bound (tensor parallelism's reference, which adds in
    another order) and the largest such bound, and how many did not match (findings)."""
    def field(record: Any, name: str, default: Any) -> Any:
        # a receipt's extra holds its records as mappings (frozen, not dicts); a fit's are SDCAuditRecords
        return record.get(name, default) if isinstance(record, Mapping) else getattr(record, name, default)

    bounds = [float(field(r, "bound", 0.0)) for r in records]
    return {"audits": len(bounds), "bitwise": sum(1 for b in bounds if b == 0.0),
            "within_bound": sum(1 for b in bounds if b > 0.0), "max_bound": max(bounds, default=0.0),
            "findings": sum(1 for r in records if not field(r, "matched", True))}
