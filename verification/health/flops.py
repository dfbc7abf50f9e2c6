"""Theoretical training FLOPs of a decoder-only transformer (6N + attention) and MFU samples."""

from __future__ import annotations

from typing import Any

import attrs

from ...contracts._checks import non_negative_int, positive_int


def _positive_finite(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < float("inf"):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def theoretical_flops_per_iter(
    *, n_params: int, n_layer: int, n_head: int, d_model: int, seq_len: int, batch_size: int
) -> float:
    """Forward+backward FLOPs of one iteration over ``batch_size`` sequences of ``seq_len`` tokens.

    Per token ``6 * n_params`` for the dense matmuls (a multiply-add is 2 FLOPs; backward is twice
    forward) plus ``12 * n_layer * d_model * seq_len`` for the attention score and value matmuls
    (the PaLM appendix / nanoGPT accounting), times ``seq_len * batch_size`` tokens.
    """
    cfg = ModelFlopConfig(n_params=n_params, n_layer=n_layer, n_head=n_head, d_model=d_model, seq_len=seq_len)
    return cfg.flops_per_iter(batch_size)


@attrs.frozen
class ModelFlopConfig:
    """The shape a transformer's FLOPs per step depend on (``n_params`` without position embeddings)."""

    n_params: int = attrs.field(validator=positive_int)
    n_layer: int = attrs.field(validator=positive_int)
    n_head: int = attrs.field(validator=positive_int)
    d_model: int = attrs.field(validator=positive_int)
    seq_len: int = attrs.field(validator=positive_int)

    def __attrs_post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token at this sequence length."""
        return 6.0 * self.n_params + 12.0 * self.n_layer * self.d_model * self.seq_len

    def flops_per_iter(self, batch_size: int) -> float:
        """Training FLOPs of one iteration over ``batch_size`` full sequences."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        return self.flops_per_token * self.seq_len * batch_size

    def flops_for_tokens(self, tokens: int) -> float:
        """Training FLOPs of ``tokens`` counted tokens (what a receipt reports)."""
        return self.flops_per_token * tokens


def flop_config_from_causal_lm(model: Any, seq_len: int) -> ModelFlopConfig:
    """A ModelFlopConfig from mixle's CausalLM (``n_layer``, ``n_head``, ``d_model`` attributes); the
    position-embedding table (``model.pos``) is a lookup, not a matmul, so it is not counted."""
    missing = [a for a in ("n_layer", "n_head", "d_model") if not hasattr(model, a)]
    if missing:
        raise TypeError(
            f"{type(model).__name__} has no {missing}; build a ModelFlopConfig(n_params, n_layer, n_head, "
            "d_model, seq_len) by hand for models that are not mixle's CausalLM"
        )
    n_params = sum(int(p.numel()) for p in model.parameters())
    pos = getattr(model, "pos", None)
    if pos is not None and hasattr(pos, "weight"):
        n_params -= int(pos.weight.numel())
    return ModelFlopConfig(n_params=n_params, n_layer=int(model.n_layer), n_head=int(model.n_head),
                           d_model=int(model.d_model), seq_len=int(seq_len))


@attrs.frozen
class MFUSample:
    """One step's model FLOPs utilization: theoretical FLOPs over wall time, against a peak."""

    step: int = attrs.field(validator=non_negative_int)
    step_flops: float = attrs.field(converter=float, validator=_positive_finite)
    step_time_s: float = attrs.field(converter=float, validator=_positive_finite)
    peak_flops_per_sec: float = attrs.field(converter=float, validator=_positive_finite)

    @property
    def achieved_flops_per_sec(self) -> float:
        """FLOPs per second this step achieved."""
        return self.step_flops / self.step_time_s

    @property
    def mfu(self) -> float:
        """Achieved over peak FLOPs per second."""
        return self.achieved_flops_per_sec / self.peak_flops_per_sec
