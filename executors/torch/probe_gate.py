"""The module probe at every ``prepare`` (issue 34 item 5): a certificate admits the user's module only once probed.

A certificate measured by the harness (or in situ for another module) says nothing about the module this run
trains: a module whose gradient differs by rank is admitted by any certificate of the plan family. So a launched
multi-rank ``prepare`` under a certificate runs the in-situ probe (``in_situ_probe.probe_module``: one seeded step
of a copy through this backend against a one-rank recomputation on rank 0) for a module, keyed by
``module_digest`` (its structure: module types, parameter names, shapes, dtypes), that was not probed under that
certificate in this process; a certificate made in situ by this very ``prepare`` already probed it. Rank 0's
verdict is broadcast: a failure is ``NotAdmittedError`` (check ``probe``) on every rank; a probe that cannot run
(no one-rank recomputation possible) is recorded, with its reason, in every receipt (``module_probe``) and logged
as the run's first line. The probe's own ``prepare`` runs under the same certificate with the probe off. A backend
whose probe cannot run at all (megatron rebuilds the module as its own stages) records why the same way
(``probe_not_run``).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
from typing import Any

import attrs
import torch.distributed as dist
from torch import nn

from ...contracts import AdmissionMode, NotAdmittedError, ParallelPlan
from ...verification.admission import AdmissionDecision
from ...verification.attestation import read_unverified
from ...verification.capability import active_harness_capability
from ...verification.in_situ import ProbeOutcome
from .in_situ_probe import probe_module

__all__ = ["module_digest", "probe_at_prepare", "probe_not_run"]

_log = logging.getLogger("mixle_parallel")

_PROBED: dict[tuple[str, str], ProbeOutcome] = {}
"""(certificate id, module digest) -> the probe's outcome in this process (every rank holds the same)."""

_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("mixle_parallel_probing", default=False)
"""True inside the probe's own ``prepare`` (which must not probe again)."""

_IN_SITU_NOTE = "certified on the spot"


def module_digest(module: nn.Module) -> str:
    """``sha256:<hex>`` of the module's structure: each submodule's name and class, each parameter's and buffer's
    name, shape, dtype and whether it trains (not the values: a probe covers the code path, not the weights)."""
    outer = hashlib.sha256()
    for name, sub in module.named_modules():
        outer.update(f"m {name} {type(sub).__module__}.{type(sub).__qualname__}\n".encode())
    for name, param in module.named_parameters():
        outer.update(f"p {name} {tuple(param.shape)} {param.dtype} {param.requires_grad}\n".encode())
    for name, buffer in module.named_buffers():
        outer.update(f"b {name} {tuple(buffer.shape)} {buffer.dtype}\n".encode())
    return "sha256:" + outer.hexdigest()


def _from_certificate(decision: AdmissionDecision) -> ProbeOutcome | None:
    """The probe outcome an in-situ certificate made by this very ``prepare`` recorded (it probed this module)."""
    if not (decision.notes and decision.notes[0].startswith(_IN_SITU_NOTE)) or decision.envelope is None:
        return None
    measurement = read_unverified(decision.envelope).measurement
    if measurement is None:
        return None
    return ProbeOutcome(measurement.probe, measurement.probe_reason, measurement.probe_max_abs_error)


def _probe_here(backend: Any, module: nn.Module, plan: ParallelPlan, precision: str, device: Any,
                decision: AdmissionDecision) -> ProbeOutcome:
    """Every rank runs the probe; rank 0's verdict is broadcast (an exception on a rank is its verdict)."""
    token = _PROBING.set(True)
    try:
        local = probe_module(backend, module, plan, precision=precision, rank=dist.get_rank(),
                             prepare_options={"device": device, "certificate": decision.envelope})
    except Exception as exc:  # noqa: BLE001 - reported on every rank through rank 0's verdict
        local = ProbeOutcome("failed", f"rank {dist.get_rank()}: the probe raised {type(exc).__name__}: {exc}")
    finally:
        _PROBING.reset(token)
    verdicts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, (local.outcome, local.reason, local.max_abs_error))
    failed = [v for v in verdicts if v[0] == "failed"]
    chosen = failed[0] if failed else verdicts[0]
    return ProbeOutcome(*chosen)


def _applies(decision: AdmissionDecision, plan: ParallelPlan) -> bool:
    """Whether a module probe belongs to this run: certified, launched over more than one rank, outside the
    probe's own ``prepare`` and the harness's trials."""
    return not (decision.mode is not AdmissionMode.CERTIFIED or plan.world_size == 1 or _PROBING.get()
                or active_harness_capability() is not None or not (dist.is_available() and dist.is_initialized()))


def probe_at_prepare(backend: Any, module: nn.Module, plan: ParallelPlan, precision: str, device: Any,
                     decision: AdmissionDecision) -> AdmissionDecision:
    """``decision`` with the probe's outcome (``AdmissionDecision.probe``) for a certified launched run of more
    than one rank; ``NotAdmittedError`` on every rank when the probe fails. Other runs are returned unchanged."""
    if not _applies(decision, plan):
        return decision
    key = (str(decision.certificate_id), module_digest(module))
    outcome = _PROBED.get(key) or _from_certificate(decision)
    if outcome is None:
        outcome = _probe_here(backend, module, plan, precision, device, decision)
    if outcome.outcome == "failed":
        raise NotAdmittedError((
            f"check 'probe' failed: under certificate {key[0][:19]}... the executor's gradients of this module "
            f"({key[1][:19]}...) differ from a one-rank recomputation: {outcome.reason}",
            "the certificate covers the plan family, not this module's gradient path: fix the module (a "
            "rank-dependent backward?) or run with admission='unverified' to record that no one vouches for it"))
    _PROBED[key] = outcome
    return _recorded(decision, outcome)


def probe_not_run(decision: AdmissionDecision, plan: ParallelPlan, reason: str) -> AdmissionDecision:
    """For a backend whose probe of the user's module cannot run (megatron): a certified launched run's
    ``decision`` with the probe recorded as skipped and ``reason``, in every receipt and as the run's first log line
    (rank 0). Other runs are returned unchanged."""
    return _recorded(decision, ProbeOutcome("skipped", reason)) if _applies(decision, plan) else decision


def _recorded(decision: AdmissionDecision, outcome: ProbeOutcome) -> AdmissionDecision:
    """``decision`` carrying ``outcome`` for every receipt; one not passed is logged once, by rank 0."""
    text = f"{outcome.outcome}: {outcome.reason}"
    if outcome.outcome != "passed" and dist.get_rank() == 0:  # every rank's receipt says it; rank 0 logs it once
        _log.warning("mixle-parallel: module probe %s", text)
    return attrs.evolve(decision, probe=text)
