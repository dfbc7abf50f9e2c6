"""Numerical evidence and SDC audit records: what the harness measured and what an audit found."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from ._checks import (
    enum_converter,
    enum_tuple,
    exact_bool,
    finite_non_negative,
    non_empty_str,
    non_negative_int,
    optional_finite_non_negative,
    optional_non_negative_int,
    positive_int,
    str_tuple,
    to_float,
    to_optional_float,
)
from .enums import KNOWN_PRECISIONS, CollectiveKind, ParallelAxis, PayloadKind
from .plan import ParallelPlan
from .serialization import SCHEMA_METADATA, content_digest, register_contract


@register_contract
@attrs.frozen
class Tolerance:
    """An elementwise bound |actual - expected| <= atol + rtol * |expected|, or bitwise equality."""

    atol: float = attrs.field(converter=to_float, validator=finite_non_negative)
    rtol: float = attrs.field(converter=to_float, validator=finite_non_negative)
    bitwise: bool = attrs.field(default=False, validator=exact_bool)
    source: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def __attrs_post_init__(self) -> None:
        if self.bitwise and (self.atol or self.rtol):
            raise ValueError("Tolerance: a bitwise tolerance has atol=0 and rtol=0")

    @classmethod
    def exact(cls, source: str = "bitwise equality") -> Tolerance:
        """Bitwise equality."""
        return cls(0.0, 0.0, True, source)


@register_contract
@attrs.frozen
class ObservedCollective:
    """A collective kind over mesh axes and how many times it ran in a traced step."""

    kind: CollectiveKind = attrs.field(converter=enum_converter(CollectiveKind))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    axes: tuple[ParallelAxis, ...] = attrs.field(converter=enum_tuple(ParallelAxis))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    count: int = attrs.field(validator=non_negative_int)


def _precision(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in KNOWN_PRECISIONS:
        raise ValueError(f"{type(inst).__name__}.precision={value!r}; allowed: {sorted(KNOWN_PRECISIONS)}")


def _collective_tuple(values: Iterable[ObservedCollective]) -> tuple[ObservedCollective, ...]:
    return tuple(values)


@register_contract
@attrs.frozen
class NumericsEvidence:
    """Per declared update: error against the single-process reference, determinism, collectives seen."""

    node_id: str = attrs.field(validator=non_empty_str)
    payload: PayloadKind = attrs.field(converter=enum_converter(PayloadKind))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    executor: str = attrs.field(validator=non_empty_str)
    plan: ParallelPlan = attrs.field(validator=attrs.validators.instance_of(ParallelPlan))
    precision: str = attrs.field(validator=_precision)
    trials: int = attrs.field(validator=positive_int)
    sample_count: int = attrs.field(validator=positive_int)
    maximum_absolute_error: float = attrs.field(converter=to_float, validator=finite_non_negative)
    maximum_relative_error: float = attrs.field(converter=to_float, validator=finite_non_negative)
    deterministic: bool = attrs.field(validator=exact_bool)
    within_tolerance: bool = attrs.field(validator=exact_bool)
    tolerance: Tolerance = attrs.field(validator=attrs.validators.instance_of(Tolerance))
    collectives_observed: tuple[ObservedCollective, ...] = attrs.field(default=(), converter=_collective_tuple)
    collectives_match: bool = attrs.field(default=True, validator=exact_bool)
    notes: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    reference_magnitude: float | None = attrs.field(
        default=None, converter=to_optional_float, validator=optional_finite_non_negative)
    """Largest finite |expected| value compared: the scale the tolerance's relative term applies to, so the gate
    can bound the error a passing record may show (None: not recorded, the gate credits only ``atol``)."""

    def __attrs_post_init__(self) -> None:
        if self.tolerance.bitwise and self.within_tolerance and self.maximum_absolute_error != 0.0:
            raise ValueError(
                f"NumericsEvidence {self.node_id!r}: a bitwise tolerance cannot pass with "
                f"maximum_absolute_error={self.maximum_absolute_error}"
            )

    @property
    def passed(self) -> bool:
        """Every bound holds: within tolerance, deterministic, and the collectives match."""
        return self.within_tolerance and self.deterministic and self.collectives_match

    @property
    def evidence_id(self) -> str:
        """Content address: sha256 of the canonical JSON."""
        return content_digest(self)

    def largest_passing_error(self, tolerance: Tolerance) -> float:
        """The largest absolute error any element can show and still pass ``tolerance`` at this record's scale.

        Under ``|a - e| <= atol' + rtol * |e|`` with ``|e| <= M`` (``reference_magnitude``) and ``atol'`` at most
        ``max(atol, rtol * M)`` (the harness scales the absolute term for mixed precision), no passing element
        differs by more than ``max(atol, rtol * M) + rtol * M``; bitwise: 0.
        """
        if tolerance.bitwise:
            return 0.0
        scale = self.reference_magnitude or 0.0
        return max(tolerance.atol, tolerance.rtol * scale) + tolerance.rtol * scale


_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_SHA256_SCHEMA = {SCHEMA_METADATA: {"pattern": "^sha256:[0-9a-f]{64}$"}}


def _sha256(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ValueError(f"{type(inst).__name__}.{attribute.name}={value!r:.80}; expected 'sha256:<64 lowercase hex>'")


AUDIT_FAMILIES = frozenset({"training", "em"})
AUDIT_REPLAYS = frozenset({"same_rank", "peer", "witness", "reference"})
"""``reference``: recomputed by the harness's independent reference, outside the backend's code."""
AUDIT_ACTIONS = frozenset({"none", "warn", "raise", "skip_step", "quarantine"})
AUDIT_CAUSES = frozenset({"", "device", "backend_defect"})
"""Why a mismatch happened: ``backend_defect`` when a replay on the same rank reproduced the wrong result
(deterministic: the backend's software), ``device`` when it did not (a fault of the rank's hardware),
``""`` when not classified (a match, or a replay kind that cannot tell)."""


def _member(allowed: frozenset[str]):  # noqa: ANN202 - validator factory
    def check(inst: object, attribute: attrs.Attribute, value: str) -> None:
        if value not in allowed:
            raise ValueError(f"SDCAuditRecord.{attribute.name}={value!r}; allowed: {sorted(allowed)}")

    return check


@register_contract
@attrs.frozen
class SDCAuditRecord:
    """One audit replay: which result was recomputed where, and whether the bits agreed."""

    family: str = attrs.field(validator=_member(AUDIT_FAMILIES))
    step: int = attrs.field(validator=non_negative_int)
    rank: int = attrs.field(validator=non_negative_int)
    unit: str = attrs.field(validator=non_empty_str)
    replay: str = attrs.field(validator=_member(AUDIT_REPLAYS))
    expected_digest: str = attrs.field(validator=_sha256, metadata=_SHA256_SCHEMA)
    observed_digest: str = attrs.field(validator=_sha256, metadata=_SHA256_SCHEMA)
    matched: bool = attrs.field(validator=exact_bool)
    action: str = attrs.field(default="none", validator=_member(AUDIT_ACTIONS))
    auditor_rank: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    attributed_rank: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    maximum_absolute_difference: float = attrs.field(default=0.0, converter=to_float, validator=finite_non_negative)
    bound: float = attrs.field(default=0.0, converter=to_float, validator=finite_non_negative)
    injected: bool = attrs.field(default=False, validator=exact_bool)
    cause: str = attrs.field(default="", validator=_member(AUDIT_CAUSES))

    def __attrs_post_init__(self) -> None:
        if self.matched and self.cause:
            raise ValueError("SDCAuditRecord: a matching audit has no cause (cause='')")
        if self.matched:
            if self.bound == 0.0 and self.expected_digest != self.observed_digest:
                raise ValueError("SDCAuditRecord: a bitwise audit cannot match with different digests")
            if self.maximum_absolute_difference > self.bound:
                raise ValueError(
                    f"SDCAuditRecord: matched with difference {self.maximum_absolute_difference} "
                    f"above its bound {self.bound}"
                )
            if self.attributed_rank is not None or self.action != "none":
                raise ValueError("SDCAuditRecord: a matching audit attributes no rank and takes no action")
        elif self.action == "none":
            raise ValueError(
                "SDCAuditRecord: a mismatch needs the action the policy took (warn, raise, skip_step, quarantine)"
            )
