"""The admission gate as every training backend's ``prepare()`` calls it (torch_native and megatron alike)."""

from __future__ import annotations

from typing import Any

from ..contracts import ParallelPlan, comm_backend_for
from ..verification.admission import AdmissionDecision, AutoCertify, require_admission

__all__ = ["admit_training"]


def admit_training(executor: Any, plan: ParallelPlan, precision: str, *, certificate: Any, admission: Any,
                   device: Any, auto_certify: AutoCertify | None = None) -> AdmissionDecision:
    """The gate for a training run of ``executor`` on ``plan`` at ``precision`` on ``device`` (a ``torch.device``
    or a device kind): a certificate that fits, ``admission="unverified"``, a single CPU process, or the
    harness's own trial; else, for a launched run with ``auto_certify`` (``training_in_situ``), a certificate made
    in situ on the run's own ranks when the trust store's policy allows it; else ``NotAdmittedError``. Runs before
    any mesh or transform exists (and before any process group unless it certifies in situ)."""
    kind = getattr(device, "type", device)
    return require_admission(executor, plan, precision, certificate=certificate, admission=admission,
                             world_size=plan.world_size, device_kind=str(kind), comm_backend=comm_backend_for(device),
                             auto_certify=auto_certify)
