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

import re
from collections.abc import Callable
from typing import Any

from ..contracts import NotAdmittedError, ParallelPlan, comm_backend_for
from ..verification.admission import AdmissionDecision, AutoCertify, require_admission
from ..verification.capability import active_harness_capability
from ..verification.keys import TrustStore, TrustStoreError

__all__ = ["admit_training", "agreed_decision"]

_CHECK = re.compile(r"check '([a-z_]+)' failed")

Gate = Callable[[AutoCertify | None], AdmissionDecision]


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
            if not _may_certify(auto_certify):
                return gate(auto_certify)  # refuses again, naming why it may not certify here (the policy)
        ensure_group()
    return agreed_decision(gate, auto_certify)


def _may_certify(auto_certify: AutoCertify | None) -> bool:
    if auto_certify is None:
        return False
    try:
        return TrustStore().automatic_certification_refusal() is None
    except TrustStoreError:
        return False


def _view(decision: AdmissionDecision | None, refusal: NotAdmittedError | None, may_certify: bool) -> dict[str, Any]:
    """What a rank would do, in terms every rank can compare (no paths, which differ between ranks' homes)."""
    if decision is not None:
        return {"mode": decision.mode.value, "certificate": decision.certificate_id}
    checks = sorted({m.group(1) for reason in (refusal.reasons if refusal else ()) for m in _CHECK.finditer(reason)})
    return {"mode": "refused", "checks": checks, "may_certify_in_situ": may_certify}


def _describe(view: dict[str, Any]) -> str:
    if view["mode"] == "refused":
        return (f"refused ({', '.join(view['checks']) or 'no reason named'}"
                + ("; would certify in situ" if view["may_certify_in_situ"] else "; may not certify in situ") + ")")
    return view["mode"] + (f" under certificate {view['certificate'][:19]}..." if view["certificate"] else "")


def agreed_decision(gate: Gate, auto_certify: AutoCertify | None) -> AdmissionDecision:
    """Every rank of the default process group: this rank's decision without certifying, every rank's view of it
    gathered (one ``all_gather_object``), then the shared decision, in-situ certification on every rank together
    when all found none and all may certify, or the same ``NotAdmittedError`` on every rank."""
    import torch.distributed as dist

    decision: AdmissionDecision | None = None
    refusal: NotAdmittedError | None = None
    try:
        decision = gate(None)
    except NotAdmittedError as exc:
        refusal = exc
    mine = _view(decision, refusal, _may_certify(auto_certify) if refusal is not None else False)
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    if any(view != views[0] for view in views):
        raise NotAdmittedError((
            "check 'agreement' failed: the ranks of this run reached different admission decisions, so none of them "
            "starts (their collectives would not match): "
            + "; ".join(f"rank {rank}: {_describe(view)}" for rank, view in enumerate(views)),
            "give every rank the same trust store and certificate (MIXLE_PARALLEL_HOME, MIXLE_PARALLEL_CERTIFICATE, "
            "certificate=/admission=) and the same policy, then launch again"))
    if decision is not None:
        return decision
    # every rank was refused alike: all may certify, and do so in situ together; or none may, and each refuses
    # again naming why (the policy), with no collective
    return gate(auto_certify)
