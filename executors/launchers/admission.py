"""The admission gate of a launch: the plan a launcher is about to start passes it before any worker exists.

Lightning Fabric and Ray Train start the ranks that a training backend (``torch_native`` unless
named) then runs on. :func:`admit_launch` checks the plan against that backend's capabilities and
admits it as the backend's own ``prepare()`` would: a certificate passed in, ``admission="unverified"``
(recorded), a fitting certificate from the local store, or -- with no certificate and the trust
store's policy allowing it -- the harness certifies the backend on the spot on this machine, for the
plan's family, before any worker starts (stored, so the launched ranks find it). Otherwise
``NotAdmittedError``, and nothing was started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts import CertificateEnvelope, NotAdmittedError, ParallelAxis, ParallelPlan, comm_backend_for
from ...verification.admission import AdmissionDecision, require_admission
from ..registry import get_training_backend, verification_target

__all__ = ["admit_launch", "family_plan", "launch_device_kind"]


def launch_device_kind(accelerator: Any) -> str:
    """The device kind a launch runs on: ``cpu``, or ``cuda`` for a GPU accelerator (``auto``: what torch sees)."""
    kind = str(getattr(accelerator, "type", accelerator)).lower()
    if kind == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if kind in ("gpu", "cuda") or kind.startswith("cuda:") else "cpu"


def family_plan(plan: ParallelPlan) -> ParallelPlan:
    """The smallest plan of ``plan``'s family (each active axis at 2, accumulation and micro-batches kept):
    what a certificate for the family is measured on, whatever the launch's size."""
    sizes = {axis.value: min(plan.size(axis), 2) for axis in ParallelAxis}
    try:
        return ParallelPlan(**sizes, microbatches=plan.microbatches,
                            gradient_accumulation_steps=plan.gradient_accumulation_steps)
    except ValueError:  # a composition that needs its own sizes: measure the plan itself
        return plan


def _certify_on_the_spot(backend: str, plan: ParallelPlan, precision: str) -> Callable[[], CertificateEnvelope] | None:
    """The harness on this machine for ``backend`` on ``plan``'s family, or None when it has no harness target."""
    try:
        target = verification_target(backend)
    except KeyError:
        return None

    def run() -> CertificateEnvelope:
        from ...verification.harness.run import verify

        return verify(target, family_plan(plan), precision=precision).certify(target)

    return run


def admit_launch(plan: ParallelPlan, *, launcher: str, backend: str, precision: str, device_kind: str,
                 admission: Any, certificate: Any) -> AdmissionDecision:
    """The gate for ``launcher`` starting ``plan``'s ranks to train with ``backend`` at ``precision``.

    Runs before any worker starts; raises ``CapabilityError`` for a plan the backend does not execute
    and ``NotAdmittedError`` (saying that nothing was started) when the run is not admitted.
    """
    executor = get_training_backend(backend)
    executor.capabilities.validate(plan, precision=precision)
    family = family_plan(plan)
    sizes = ",".join(f"{a.value}={family.size(a)}" for a in ParallelAxis if family.size(a) > 1) or "dp_replicate=1"
    command = f"mixle-parallel certify --backend {backend} --plan {sizes} --precision {precision} --out cert.json"
    try:
        return require_admission(executor, plan, precision, certificate=certificate, admission=admission,
                                 world_size=plan.world_size, device_kind=device_kind,
                                 comm_backend=comm_backend_for(device_kind),
                                 auto_certify=_certify_on_the_spot(backend, plan, precision), certify_command=command)
    except NotAdmittedError as exc:
        raise NotAdmittedError((*exc.reasons, f"{launcher} started no worker: the plan was refused before launch; "
                                "pass certificate=, or admission='unverified' to run anyway (recorded)")) from None
