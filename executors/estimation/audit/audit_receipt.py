"""The ledger receipt of one audited EM iteration (rows, log-likelihood, admission, audit summary)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ....contracts import StepReceipt
from ....verification.sdc.em import ChunkAudit

__all__ = ["em_receipt"]


def em_receipt(
    iteration: int,
    nobs: float,
    log_likelihood: float,
    *,
    workers: int,
    admission: Any,
    outcomes: Sequence[ChunkAudit] = (),
    quarantined: Sequence[int] = (),
    observability: Mapping[str, Any] | None = None,
    transport_bytes: int | None = None,
) -> StepReceipt:
    """The receipt of one EM iteration: rows, mean negative log-likelihood, admission and audit summary.

    ``transport_bytes`` is what the runner handed its transport in the pass (requests with
    the model, replies with the statistics); None when the runner does not count (``bytes_observed``
    is then false and ``collective_bytes`` 0).
    """
    finite = math.isfinite(log_likelihood)
    loss = -log_likelihood / nobs if finite and nobs > 0 else 0.0
    records = [r for o in outcomes for r in o.records]
    extra = {
        **(admission.receipt_extra() if admission is not None else {}),
        "kind": "em_iteration",
        "log_likelihood": log_likelihood if finite else str(log_likelihood),
        "audited_chunks": [o.chunk for o in outcomes],
        "audit_mismatches": sum(1 for r in records if not r.matched),
        "quarantined": sorted(int(w) for w in quarantined),
        **({"observability": dict(observability)} if observability is not None else {}),
        "bytes_observed": transport_bytes is not None,
    }
    rows = int(round(nobs))
    return StepReceipt(
        step=iteration,
        loss=float(loss),
        local_examples=rows,
        local_tokens=0,
        microbatches=1,
        accumulation_steps=1,
        data_parallel_size=max(1, int(workers)),
        optimizer="em",
        precision="fp64",
        collective_bytes=int(transport_bytes or 0),
        extra=extra,
        global_examples_observed=rows,
    )
