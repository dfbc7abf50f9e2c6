"""The admission gate as every training backend's ``prepare()`` calls it (torch_native and megatron alike).

In a launched multi-rank run the ranks agree before they act (issue 34 item 6): each rank decides from its own
view (its trust store, the certificate it would use, its policy), the views are compared in one collective on
the run's process group before any executor collective, and either every rank follows the one decision they
share, or every rank raises the same ``NotAdmittedError`` naming each rank's view. In-situ certification starts
only when every rank found no certificate and every rank may certify. Where no process group exists yet, a rank
whose own store refuses it and which may not certify in situ refuses at once, before any group (as the policy
tests of issue 23 require); the launcher then ends the other ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..contracts import NotAdmittedError, ParallelPlan, comm_backend_for
from ..verification.admission import AdmissionDecision, AutoCertify, require_admission
from ..verification.capability import active_harness_capability
from ..verification.rank_agreement import AdmissionView, Gate, may_certify_in_situ
from ..verification.rank_agreement import agreed_decision as shared_agreed_decision

__all__ = ["admit_training", "agreed_decision"]


def admit_training(executor: Any, plan: ParallelPlan, precision: str, *, certificate: Any, admission: Any,
                   device: Any, auto_certify: AutoCertify | None = None,
                   ensure_group: Callable[[], Any] | None = None) -> AdmissionDecision:
    """The gate for a training run of ``executor`` on ``plan`` at ``precision`` on ``device`` (a ``torch.device``
    or a device kind): a certificate that fits, ``admission="unverified"``, a single CPU process, or the
    harness's own trial; else, for a launched run with ``auto_certify`` (``training_in_situ``), a certificate made
    in situ on the run's own ranks when the trust store's policy allows it; else ``NotAdmittedError``. Runs before
    any mesh or transform exists. In a launched run of more than one rank, ``ensure_group`` makes (or checks) the
    process group and the ranks agree on the decision (``agreed_decision``) before anything else runs."""
    kind = getattr(device, "type", device)

    def gate(auto: AutoCertify | None) -> AdmissionDecision:
        return require_admission(executor, plan, precision, certificate=certificate, admission=admission,
                                 world_size=plan.world_size, device_kind=str(kind),
                                 comm_backend=comm_backend_for(device), auto_certify=auto)

    if ensure_group is None or plan.world_size == 1 or active_harness_capability() is not None:
        return gate(auto_certify)  # one rank, or the harness's own trial (its collectives are traced)
    from .training_in_situ import launched

    if not launched():
        return gate(auto_certify)
    import torch.distributed as dist

    if not dist.is_initialized():
        try:  # a rank its own store refuses, with no in-situ certification possible, refuses before any group
            gate(None)
        except NotAdmittedError:
            if not may_certify_in_situ(auto_certify):
                return gate(auto_certify)  # refuses again, naming why it may not certify here (the policy)
        ensure_group()
    return agreed_decision(gate, auto_certify)


def _all_gather(view: AdmissionView) -> list[AdmissionView]:
    """Every rank's view on every rank: one ``all_gather_object`` on the default process group."""
    import torch.distributed as dist

    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, view)
    return views


def agreed_decision(gate: Gate, auto_certify: AutoCertify | None) -> AdmissionDecision:
    """Every rank of the default process group: the shared comparison of ``verification.rank_agreement`` over
    one ``all_gather_object``; the shared decision, in-situ certification on every rank together, or the same
    ``NotAdmittedError`` on every rank."""
    return shared_agreed_decision(gate, auto_certify, _all_gather)
