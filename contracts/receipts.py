"""StepReceipt and TorchSessionState: unambiguous accounting for optimizer updates."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._checks import (
    exact_bool,
    non_empty_str,
    non_negative_int,
    optional_non_negative_int,
    positive_int,
    real_number,
    to_float,
)
from .bounded_json import CONTRACT_LIMITS, check_shape
from .errors import ContractError
from .frozen_mapping import FrozenDict, to_frozen_dict
from .serialization import MAX_INT, SCHEMA_METADATA, SCHEMA_VERSION, converter, from_dict, register_contract

NONFINITE_LOSS_KEY = "nonfinite_loss"
"""How a non-finite loss is written: ``"loss": null`` and ``extra["nonfinite_loss"]`` = ``"nan"``, ``"inf"``
or ``"-inf"`` (strict JSON has no NaN or Infinity); reading turns it back into the float. A non-finite
number elsewhere in ``extra`` (a health anomaly's value) is written as that text too, and read as text."""
_NONFINITE_TEXT = ("nan", "inf", "-inf")


def _rates(values: Any) -> tuple[float, ...]:
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise ContractError(f"StepReceipt.learning_rates must be a sequence of numbers, got {type(values).__name__}")
    return tuple(to_float(v) for v in values)


def _finite_rates(inst: Any, attribute: Any, value: tuple[float, ...]) -> None:
    for rate in value:
        if isinstance(rate, bool) or not isinstance(rate, float) or not math.isfinite(rate) or rate < 0:
            raise ContractError(f"StepReceipt.learning_rates must hold finite numbers >= 0 (one per parameter "
                                f"group), got {rate!r}")


@register_contract
@attrs.frozen
class StepReceipt:
    """One training call's accounting: counts seen, loss, bytes really communicated, skip flag.

    ``skipped`` receipts are issued for micro-steps before the accumulation clock fires and for
    steps a policy kept out of the optimizer (the reason is in ``extra``).
    """

    step: int = attrs.field(validator=non_negative_int)
    loss: float = attrs.field(converter=to_float, validator=real_number,
                              metadata={SCHEMA_METADATA: {"type": ["number", "null"]}})
    """Mean loss; a step skipped for a non-finite loss holds NaN/inf here (written as null, ``NONFINITE_LOSS_KEY``)."""
    local_examples: int = attrs.field(validator=non_negative_int)
    local_tokens: int = attrs.field(validator=non_negative_int)
    microbatches: int = attrs.field(validator=positive_int)
    accumulation_steps: int = attrs.field(validator=positive_int)
    data_parallel_size: int = attrs.field(validator=positive_int)
    optimizer: str = attrs.field(validator=non_empty_str)
    precision: str = attrs.field(validator=non_empty_str)
    collective_bytes: int = attrs.field(default=0, validator=non_negative_int)
    skipped: bool = attrs.field(default=False, validator=exact_bool)
    extra: FrozenDict = attrs.field(factory=FrozenDict, converter=to_frozen_dict)
    global_examples_observed: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    global_tokens_observed: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    learning_rates: tuple[float, ...] = attrs.field(default=(), converter=_rates, validator=_finite_rates)
    """The learning rate of each optimizer parameter group, in group order: for a committed step the rate
    that step used (read before the scheduler steps), else the rate the next step would use. Empty where the
    executor cannot read the optimizer's groups."""

    def __attrs_post_init__(self) -> None:
        for local, observed in (
            ("local_examples", "global_examples_observed"),
            ("local_tokens", "global_tokens_observed"),
        ):
            glob = getattr(self, observed)
            if glob is not None and glob < getattr(self, local):
                raise ValueError(
                    f"StepReceipt.{observed}={glob} is smaller than {local}={getattr(self, local)}; "
                    "the global count includes this rank's"
                )

    @property
    def global_examples(self) -> int:
        """Examples over the data-parallel domain: the observed all-reduced count when the session took one,
        else ``local_examples * data_parallel_size`` (mixle's estimate for equal local batches)."""
        if self.global_examples_observed is not None:
            return self.global_examples_observed
        return self.local_examples * self.data_parallel_size

    @property
    def global_tokens(self) -> int:
        """Counted tokens over the data-parallel domain: observed when available, else local times dp size."""
        if self.global_tokens_observed is not None:
            return self.global_tokens_observed
        return self.local_tokens * self.data_parallel_size


@register_contract
@attrs.frozen
class TorchSessionState:
    """Serializable non-tensor clocks owned by a training session."""

    step: int = attrs.field(validator=non_negative_int)
    pending_accumulation: int = attrs.field(validator=non_negative_int)
    optimizer_receipt: FrozenDict = attrs.field(factory=FrozenDict, converter=to_frozen_dict)


def _unstructure_receipt(receipt: StepReceipt) -> dict[str, Any]:
    """A receipt's JSON data; a non-finite loss is written as null with its text in ``extra``."""
    data = {field.name: converter.unstructure(getattr(receipt, field.name))
            for field in attrs.fields(StepReceipt)}
    data["extra"] = _finite_json(data["extra"])
    if not math.isfinite(receipt.loss):
        data["loss"] = None
        data["extra"] = {**data["extra"], NONFINITE_LOSS_KEY: repr(receipt.loss)}
    return data


def _finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its text ("nan", "inf", "-inf"): strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v) for v in value]
    return value


_structure_fields = converter.get_structure_hook(StepReceipt)


def _structure_receipt(data: Any, cls: type[StepReceipt]) -> StepReceipt:
    """Inverse of ``_unstructure_receipt``: a null loss needs its ``extra["nonfinite_loss"]`` text."""
    if isinstance(data, Mapping) and "loss" in data and data["loss"] is None:
        extra = data.get("extra")
        text = extra.get(NONFINITE_LOSS_KEY) if isinstance(extra, Mapping) else None
        if text not in _NONFINITE_TEXT:
            raise ContractError(f"StepReceipt.loss is null but extra[{NONFINITE_LOSS_KEY!r}] is {text!r}, not one of "
                                f"{_NONFINITE_TEXT}: a non-finite loss is written as null with its text", path="$.loss")
        assert isinstance(extra, Mapping)
        data = {**data, "loss": float(text), "extra": {k: v for k, v in extra.items() if k != NONFINITE_LOSS_KEY}}
    return _structure_fields(data, cls)


converter.register_unstructure_hook(StepReceipt, _unstructure_receipt)
converter.register_structure_hook(StepReceipt, _structure_receipt)


_RECEIPT_FIELDS = frozenset(field.name for field in attrs.fields(StepReceipt))
_INT_FIELDS = ("step", "local_examples", "local_tokens", "microbatches", "accumulation_steps", "data_parallel_size",
               "collective_bytes", "global_examples_observed", "global_tokens_observed")


def receipt_from_document(document: Any) -> StepReceipt:
    """``from_dict(document, StepReceipt)``, faster for a well-formed receipt (the ledger audit reads millions).

    A document with exactly the envelope, the fields and JSON scalar values is built directly (the
    field validators check every value, ``extra`` gets the tree checks); anything else goes through
    ``from_dict``, so what is refused, and the error, are the same.
    """
    data = document.get("data") if isinstance(document, dict) else None
    if (isinstance(data, dict) and len(document) == 3 and document.get("kind") == "StepReceipt"
            and document.get("version") == SCHEMA_VERSION and data.keys() == _RECEIPT_FIELDS
            and isinstance(data["extra"], dict) and isinstance(data["loss"], (int, float))
            and not isinstance(data["loss"], bool)
            and all(not isinstance(data[name], int) or abs(data[name]) <= MAX_INT for name in _INT_FIELDS)):
        try:
            if data["extra"]:
                check_shape(data["extra"], CONTRACT_LIMITS, path="$.data.extra")
            return StepReceipt(**data)
        except (ValueError, TypeError):
            pass  # from_dict says what is wrong, in its words
    return from_dict(document, StepReceipt)


_NON_NEGATIVE = ("step", "local_examples", "local_tokens", "collective_bytes")
_POSITIVE = ("microbatches", "accumulation_steps", "data_parallel_size")
_OBSERVED = (("global_examples_observed", "local_examples"), ("global_tokens_observed", "local_tokens"))
_EXTRA_SCALARS = (str, int, float, bool, type(None))


def _plain_scalars(extra: Any) -> bool:
    """An ``extra`` of str keys and JSON scalar values that ``check_shape`` and ``FrozenDict`` accept."""
    for key, value in extra.items():
        kind = type(value)
        if type(key) is not str or not key.isascii() or kind not in _EXTRA_SCALARS:
            return False
        if (kind is str and not value.isascii()) or (kind is int and not -MAX_INT <= value <= MAX_INT):
            return False
    return True


def _counts_hold(data: dict[str, Any]) -> bool:
    """The int fields: exact ints within their bounds, observed global counts >= the local ones."""
    for name in _NON_NEGATIVE:
        value = data[name]
        if type(value) is not int or value < 0 or value > MAX_INT:
            return False
    for name in _POSITIVE:
        value = data[name]
        if type(value) is not int or value < 1 or value > MAX_INT:
            return False
    for seen, local in _OBSERVED:
        value = data[seen]
        if value is not None and (type(value) is not int or value < data[local] or value > MAX_INT):
            return False
    return True


def _checked_data(document: Any) -> dict[str, Any] | None:
    """The ``data`` of a receipt document when every field provably passes StepReceipt's validators, else None."""
    data = document.get("data") if type(document) is dict else None
    if (type(data) is not dict or len(document) != 3 or document.get("kind") != "StepReceipt"
            or type(document.get("version")) is not int or document["version"] != SCHEMA_VERSION
            or data.keys() != _RECEIPT_FIELDS or not _counts_hold(data)):
        return None
    loss, optimizer, precision, extra = data["loss"], data["optimizer"], data["precision"], data["extra"]
    if type(loss) is not float and (type(loss) is not int or not -MAX_INT <= loss <= MAX_INT):
        return None
    if type(optimizer) is not str or type(precision) is not str or not optimizer.strip() or not precision.strip():
        return None
    if type(data["skipped"]) is not bool or type(extra) is not dict or (extra and not _plain_scalars(extra)):
        return None
    return data


def receipt_facts(document: Any) -> tuple[int, bool, Mapping[str, Any]]:
    """(step, skipped, extra) of a StepReceipt document: accepted and refused exactly as ``receipt_from_document``.

    For the ledger audit, which reads millions and needs only these three: a document whose every field
    provably passes StepReceipt's validators (exact ints in range, global counts >= local ones, a real
    loss, non-blank strings, a real bool, an ``extra`` of JSON scalars) is checked without building a
    receipt; anything else is built by ``receipt_from_document`` (the same receipt, or the same error).
    """
    data = _checked_data(document)
    if data is None:
        receipt = receipt_from_document(document)
        return receipt.step, receipt.skipped, receipt.extra
    return data["step"], data["skipped"], data["extra"]
