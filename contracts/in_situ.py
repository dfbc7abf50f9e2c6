"""``InSituMeasurement``: how a certificate measured on a launched run's own process group was made.

A certificate without one (``AdmissionCertificate.measurement`` None) was measured by the harness on a
mesh it spawned. One with it was measured *in situ*: the harness's reference workload ran on the very
ranks of a launched job (torchrun, mpiexec) before its first step, and, for training, a probe of the
user's own module compared the executor's gradients with a one-rank recomputation (or says why not).
"""

from __future__ import annotations

import math

import attrs

from ._checks import non_empty_str, positive_int
from .serialization import register_contract

__all__ = ["IN_SITU_PROBE_OUTCOMES", "InSituMeasurement"]

IN_SITU_PROBE_OUTCOMES = ("passed", "skipped", "not_applicable")
"""What the probe of the user's own module did: compared and agreed, skipped (the reason says why), or there is
no user module to probe (EM: the model is the reference workload's). A failed probe issues no certificate."""


def _site(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value != "in_situ":
        raise ValueError(f"InSituMeasurement.site={value!r}; expected 'in_situ'")


def _outcome(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in IN_SITU_PROBE_OUTCOMES:
        raise ValueError(f"InSituMeasurement.probe={value!r}; expected one of {', '.join(IN_SITU_PROBE_OUTCOMES)}")


def _error(inst: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value < 0):
        raise ValueError(f"InSituMeasurement.{attribute.name}={value!r}; expected a finite number >= 0 or null")


@register_contract
@attrs.frozen
class InSituMeasurement:
    """Where and how an in-situ certificate was measured: the launch, its world, the workload, the probe."""

    launcher: str = attrs.field(validator=non_empty_str)
    """What started the ranks (``torchrun``, ``mpiexec``, ``launched`` when unknown)."""
    world_size: int = attrs.field(validator=positive_int)
    """The number of ranks the measurement ran on (the run's own process group)."""
    workload: str = attrs.field(validator=non_empty_str)
    """The harness reference workload that ran on those ranks."""
    probe: str = attrs.field(validator=_outcome)
    """The probe of the user's own module: ``passed``, ``skipped`` or ``not_applicable``."""
    probe_reason: str = attrs.field(validator=attrs.validators.instance_of(str))
    """What the probe compared, or why it was skipped."""
    probe_max_abs_error: float | None = attrs.field(default=None, validator=_error)
    """The probe's largest absolute gradient difference against the one-rank recomputation (None unless passed)."""
    seconds: float = attrs.field(default=0.0, validator=_error)
    """Seconds spent certifying in situ (workload, probe, judging and signing)."""
    site: str = attrs.field(default="in_situ", validator=_site)
    """Always ``in_situ`` (a harness-measured certificate has no measurement record)."""

    def __attrs_post_init__(self) -> None:
        if (self.probe == "passed") != (self.probe_max_abs_error is not None):
            raise ValueError("InSituMeasurement.probe_max_abs_error is set exactly when probe='passed' "
                             f"(probe={self.probe!r}, probe_max_abs_error={self.probe_max_abs_error!r})")
        if self.probe != "passed" and not self.probe_reason:
            raise ValueError(f"InSituMeasurement.probe={self.probe!r} needs a probe_reason saying why")
