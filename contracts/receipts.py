"""StepReceipt and TorchSessionState: unambiguous accounting for optimizer updates."""

from __future__ import annotations

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
from .frozen_mapping import FrozenDict, to_frozen_dict
from .serialization import register_contract


@register_contract
@attrs.frozen
class StepReceipt:
    """One training call's accounting: counts seen, loss, bytes really communicated, skip flag.

    ``skipped`` receipts are issued for micro-steps before the accumulation clock fires and for
    steps a policy kept out of the optimizer (the reason is in ``extra``).
    """

    step: int = attrs.field(validator=non_negative_int)
    loss: float = attrs.field(converter=to_float, validator=real_number)
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
