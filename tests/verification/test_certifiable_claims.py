"""Claimed capabilities are certifiable: torch_native at bf16 and fp16 (the reference in the same mixed-precision
policy), context parallelism on the bidirectional attention workload, megatron's pipeline stages
(megatron's tp=2 and ep=2: tests/megatron/test_megatron_verification.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.cli import main
from mixle_parallel.verification.harness.tolerance import MIXED_SCALED_NOTE, compare, default_tolerance


def test_mixed_precision_bound_is_scaled_by_the_tensor():
    tol = default_tolerance("bf16")
    assert (tol.rtol, tol.atol) == (1.6e-2, 1e-5) and MIXED_SCALED_NOTE in tol.source
    expected = np.array([1.0, -0.5, 1e-4])  # the last element cancelled to near zero
    near = expected + np.array([0.0, 0.0, 1e-3])  # an error of the size of its summands' rounding
    assert not compare(near, expected, tol).within  # elementwise, torch.testing's rule refuses it
    assert compare(near, expected, tol, scaled=True).within
    wrong = expected * np.array([1.05, 1.0, 1.0])  # 5% off on the largest element: a real bug
    assert not compare(wrong, expected, tol, scaled=True).within


@pytest.mark.parametrize("argv", [
    ["--backend", "torch_native", "--plan", "dp_shard=2", "--precision", "bf16"],
    ["--backend", "torch_native", "--plan", "cp=2"],
    ["--backend", "megatron", "--plan", "pp=2"],
    pytest.param(["--backend", "torch_native", "--plan", "dp_shard=2", "--precision", "fp16"], marks=pytest.mark.slow),
    pytest.param(["--backend", "torch_native", "--plan", "cp=2,dp_shard=2"], marks=pytest.mark.slow),  # world 4
], ids=["torch_native_bf16_dp_shard2", "torch_native_cp2", "megatron_pp2", "torch_native_fp16_dp_shard2",
        "torch_native_cp2_dp_shard2"])
def test_verify_passes(argv: list[str], capsys: pytest.CaptureFixture[str]):
    code = main(["verify", *argv])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out
