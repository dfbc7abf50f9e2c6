"""The default tolerance policy per precision, with its sources, and the one comparison rule.

Floating-point collectives change the reduction order, so a distributed gradient differs from
the single-process one in the last bits; the bound it must stay within is PyTorch's own default
for ``torch.testing.assert_close`` at that dtype (the closeness test is the same:
``|actual - expected| <= atol + rtol * |expected|`` elementwise). EM statistics are compared with
a one-piece reference within the stated fp64 bound ``em_reference.EM_REFERENCE_TOLERANCE``; across
worker counts they are combined in chunk order, so there they must agree bitwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from ...contracts import KNOWN_PRECISIONS, Tolerance
from .em_reference import EM_REFERENCE_TOLERANCE

TORCH_TESTING_SOURCE = (
    "torch.testing.assert_close default for {dtype} (PyTorch docs, torch.testing: "
    "https://pytorch.org/docs/stable/testing.html)"
)
"""Citation template: the defaults below are the documented torch.testing.assert_close table."""

# (rtol, atol) per precision name, as documented for torch.testing.assert_close:
#   float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5, float32 1.3e-6 / 1e-5, float64 1e-7 / 1e-7.
_TORCH_TESTING_DEFAULTS: dict[str, tuple[float, float, str]] = {
    "fp64": (1e-7, 1e-7, "torch.float64"),
    "fp32": (1.3e-6, 1e-5, "torch.float32"),
    "fp16": (1e-3, 1e-5, "torch.float16"),
    "bf16": (1.6e-2, 1e-5, "torch.bfloat16"),
}
# tf32 matmuls keep a 10-bit mantissa like fp16; fp8 has no torch.testing default: we take
# bf16's bound for tf32 (documented as a project choice) and refuse to guess one for fp8.
_PROJECT_CHOICES: dict[str, tuple[float, float, str]] = {
    "tf32": (1e-3, 1e-5, "mixle-parallel choice: tf32 matmul inputs keep 10 mantissa bits, "
                         "so torch.testing's float16 bound (1e-3 / 1e-5) applies"),
}

MIXED_SCALED = frozenset({"bf16", "fp16"})
"""Precisions run as fp32 master weights + autocast, judged with ``compare(..., scaled=True)``."""

MIXED_SCALED_NOTE = (
    "; mixed precision (fp32 master weights, autocast forward): the absolute term is at least "
    "rtol x the tensor's max |expected| (a low-precision rounding of a sum is relative to its summands)"
)
"""What the source of a mixed-precision tolerance adds: the per-tensor scale of the absolute term."""

EM_STATISTICS_TOLERANCE = Tolerance.exact(
    "EM sufficient statistics are combined in chunk order independent of the worker count, "
    "so every backend and worker count must give the same bits"
)
"""EM statistics are judged bitwise across worker counts (the same executor on one worker)."""


def default_tolerance(precision: str, *, family: str = "training") -> Tolerance:
    """The stated default bound for ``precision`` (``family="em"``: the fp64 bound against the one-piece reference)."""
    if family == "em":
        return EM_REFERENCE_TOLERANCE
    if family != "training":
        raise ValueError(f"family={family!r}; expected 'training' or 'em'")
    if precision in _TORCH_TESTING_DEFAULTS:
        rtol, atol, dtype = _TORCH_TESTING_DEFAULTS[precision]
        source = TORCH_TESTING_SOURCE.format(dtype=dtype)
        if precision in MIXED_SCALED:
            source += MIXED_SCALED_NOTE
        return Tolerance(atol=atol, rtol=rtol, source=source)
    if precision in _PROJECT_CHOICES:
        rtol, atol, source = _PROJECT_CHOICES[precision]
        return Tolerance(atol=atol, rtol=rtol, source=source)
    if precision in KNOWN_PRECISIONS:
        raise ValueError(
            f"no default tolerance for precision {precision!r} (torch.testing states none); "
            "pass tolerance=Tolerance(atol=..., rtol=..., source='why') explicitly"
        )
    raise ValueError(f"unknown precision {precision!r}; known: {sorted(KNOWN_PRECISIONS)}")


def tolerance_policy() -> dict[str, dict[str, Any]]:
    """The whole default policy as a table (for docs, certificates and the CLI)."""
    table: dict[str, dict[str, Any]] = {}
    for precision in sorted(set(_TORCH_TESTING_DEFAULTS) | set(_PROJECT_CHOICES)):
        table[precision] = attrs.asdict(default_tolerance(precision))
    table["em"] = attrs.asdict(EM_REFERENCE_TOLERANCE)
    return table


@attrs.frozen
class Comparison:
    """Max absolute and relative error of ``actual`` against ``expected`` and the verdict."""

    maximum_absolute_error: float
    maximum_relative_error: float
    within: bool
    sample_count: int
    bitwise_equal: bool
    reference_magnitude: float = 0.0
    """Largest finite |expected| value (what the relative term of the tolerance scales with)."""


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        value = value.cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def compare(actual: Any, expected: Any, tolerance: Tolerance, *, scaled: bool = False) -> Comparison:
    """Compare two arrays (numpy or torch) under ``tolerance``, torch.testing's rule elementwise.

    ``scaled`` (mixed precision): the absolute term is at least ``rtol * max|expected|`` of the
    tensor, because a bf16/fp16 rounding of a sum is relative to its summands, not to the sum, so
    an element that cancels to near zero carries the error of the terms it cancelled.
    """
    a, e = _as_numpy(actual), _as_numpy(expected)
    if a.shape != e.shape:
        raise ValueError(f"shape {a.shape} differs from the reference's {e.shape}; return full, unsharded values")
    bitwise = a.dtype == e.dtype and a.tobytes() == e.tobytes()
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    if a.size == 0:
        return Comparison(0.0, 0.0, True, 0, bitwise)
    finite = np.isfinite(a64) & np.isfinite(e64)
    magnitude = np.abs(np.where(finite, e64, 0.0))
    scale = float(magnitude.max())
    same_nonfinite = ~finite & ((a64 == e64) | (np.isnan(a64) & np.isnan(e64)))
    diff = np.where(finite, np.abs(a64 - e64), np.where(same_nonfinite, 0.0, np.inf))
    rel = np.where(finite, diff / np.maximum(np.abs(e64), np.finfo(np.float64).tiny), diff)
    max_abs, max_rel = float(diff.max()), float(rel.max())
    if tolerance.bitwise:
        within = bitwise
    else:
        atol = max(tolerance.atol, tolerance.rtol * scale) if scaled else tolerance.atol
        within = bool(np.all(diff <= atol + tolerance.rtol * magnitude))
    return Comparison(max_abs, max_rel, within, int(a.size), bitwise, scale)


def tolerance_from_mapping(data: Mapping[str, Any]) -> Tolerance:
    """Build a Tolerance from a plain mapping (CLI and config files)."""
    return Tolerance(**dict(data))
