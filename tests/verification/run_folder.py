"""A small run folder built by hand (no processes): a signed stub certificate, a ledger of one run with audit
records (one finding), a model folder and its provenance statement. What verify-run and the report read."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification import Ledger, save_certificate
from mixle_parallel.verification.admission import certify
from mixle_parallel.verification.provenance import write_provenance
from tests.verification.vhelpers import StubExecutor, make_audit, make_evidence, make_receipt

PLAN = ParallelPlan(dp_shard=2, tp=2)
DATA = np.linspace(0.0, 1.0, 64)


def make_run(run: Path, *, steps: int = 4) -> Path:
    """Write the run folder ``run``: certificate-stub.json, ledger.jsonl(.head), model/ and model.intoto.json."""
    run.mkdir(parents=True, exist_ok=True)
    envelope = certify([make_evidence(PLAN)], executor=StubExecutor(), plan=PLAN, precision="fp32", store=False)
    save_certificate(envelope, run / "certificate-stub.json")
    ledger = Ledger(run / "ledger.jsonl")
    ledger.run_start(plan=PLAN, certificate=envelope, executor="stub", extra={"admission": "certified"})
    for iteration in range(3):  # an EM fit first: its receipts carry the log-likelihood
        ledger.receipt(attrs.evolve(make_receipt(iteration), optimizer="em", extra={
            "kind": "em_iteration", "log_likelihood": -500.0 + 100 * (1 - 0.5 ** iteration)}))
    ledger.audit(attrs.evolve(make_audit(1), family="em", unit="chunk:3"))
    ledger.run_end(steps=3)
    ledger.run_start(plan=PLAN, certificate=envelope, executor="stub",
                     extra={"precision": "fp32", "admission": "certified"})
    for step in range(steps):
        health = {"rank_step_s": [0.1 + 0.01 * step, 0.12 + 0.005 * step]}
        ledger.receipt(attrs.evolve(make_receipt(step), loss=2.0 / (step + 1), extra={"health": health}))
        if step % 2 == 0:
            ledger.audit(make_audit(step, rank=step % 2))
    ledger.audit(attrs.evolve(make_audit(steps - 1, rank=1), matched=False, action="warn", cause="device",
                              observed_digest="sha256:" + "bb" * 32))
    ledger.run_end(steps=steps)
    model = run / "model"
    (model / "weights").mkdir(parents=True)
    (model / "weights" / "layer0.bin").write_bytes(bytes(range(256)) * 4)
    (model / "config.json").write_text('{"layers": 1}\n')
    write_provenance(model, ledger=run / "ledger.jsonl", kind="training", run_id="run-0001", data=DATA)
    return run
