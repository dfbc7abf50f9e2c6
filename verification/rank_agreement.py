"""Ranks agree on the admission decision before they act (issue 34 item 6), over whatever transport they share.

Each rank of a launched run decides from its own view (its trust store, the certificate it would use, its
policy, whether it may certify in situ); the views are exchanged in one collective (``ViewExchange``: torch's
``all_gather_object``, an MPI communicator's ``allgather``) before any executor collective, and either every
rank follows the one decision they share, or every rank raises the same ``NotAdmittedError`` naming each rank's
view. In-situ certification starts only when every rank found no certificate and every rank may certify.
Training (``executors.training_admission``) and launched EM (``executors.estimation.admission``) share this
comparison; each brings its own exchange.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..contracts import NotAdmittedError
from .admission import AdmissionDecision, AutoCertify
from .keys import TrustStore, TrustStoreError

__all__ = ["AdmissionView", "Gate", "ViewExchange", "admission_view", "agreed_decision", "describe_view",
           "may_certify_in_situ"]

_CHECK = re.compile(r"check '([a-z_]+)' failed")

AdmissionView = Mapping[str, Any]
"""What one rank would do, in plain values every rank can compare (``admission_view``)."""

Gate = Callable[[AutoCertify | None], AdmissionDecision]
"""This rank's admission gate, given the in-situ certifier it may use (None: decide without certifying)."""


class ViewExchange(Protocol):
    """One collective over the run's ranks: every rank's view, in rank order, on every rank."""

    def __call__(self, view: AdmissionView) -> Sequence[AdmissionView]:
        """Every rank calls it with its own view and gets all of them."""
        ...


def may_certify_in_situ(auto_certify: AutoCertify | None) -> bool:
    """Whether this rank may certify in situ: it has a certifier and its trust store's policy allows it now."""
    if auto_certify is None:
        return False
    try:
        return TrustStore().automatic_certification_refusal() is None
    except TrustStoreError:
        return False


def admission_view(decision: AdmissionDecision | None, refusal: NotAdmittedError | None,
                   may_certify: bool) -> dict[str, Any]:
    """What a rank would do, in terms every rank can compare (no paths, which differ between ranks' homes): the
    mode and certificate of its decision, or the checks that refused it and whether it may certify in situ."""
    if decision is not None:
        return {"mode": decision.mode.value, "certificate": decision.certificate_id}
    checks = sorted({m.group(1) for reason in (refusal.reasons if refusal else ()) for m in _CHECK.finditer(reason)})
    return {"mode": "refused", "checks": checks, "may_certify_in_situ": may_certify}


def describe_view(view: AdmissionView) -> str:
    """One rank's view in words, for the error that names every rank's."""
    if view.get("mode") == "refused":
        return (f"refused ({', '.join(view.get('checks') or ()) or 'no reason named'}"
                + ("; would certify in situ" if view.get("may_certify_in_situ") else "; may not certify in situ")
                + ")")
    certificate = view.get("certificate")
    return str(view.get("mode")) + (f" under certificate {str(certificate)[:19]}..." if certificate else "")


def agreed_decision(gate: Gate, auto_certify: AutoCertify | None, exchange: ViewExchange) -> AdmissionDecision:
    """Every rank of the run: this rank's decision without certifying, every rank's view of it exchanged (one
    collective), then the shared decision; in-situ certification on every rank together when all found none and
    all may certify; or the same ``NotAdmittedError`` on every rank."""
    decision: AdmissionDecision | None = None
    refusal: NotAdmittedError | None = None
    try:
        decision = gate(None)
    except NotAdmittedError as exc:
        refusal = exc
    mine = admission_view(decision, refusal, may_certify_in_situ(auto_certify) if refusal is not None else False)
    views = [dict(view) for view in exchange(mine)]
    if any(view != views[0] for view in views):
        raise NotAdmittedError((
            "check 'agreement' failed: the ranks of this run reached different admission decisions, so none of them "
            "starts (their collectives would not match): "
            + "; ".join(f"rank {rank}: {describe_view(view)}" for rank, view in enumerate(views)),
            "give every rank the same trust store and certificate (MIXLE_PARALLEL_HOME, MIXLE_PARALLEL_CERTIFICATE, "
            "certificate=/admission=) and the same policy, then launch again"))
    if decision is not None:
        return decision
    # every rank was refused alike: all may certify, and do so in situ together; or none may, and each refuses
    # again naming why (the policy), with no collective
    return gate(auto_certify)
