"""torch_native at fp16: fp32 master weights and gradients, the forward under autocast(float16), one process."""

from __future__ import annotations

import numpy as np
import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification.harness.tolerance import MIXED_SCALED_NOTE, compare, default_tolerance
from mixle_parallel.verification.harness.workloads import MLPWorkload


def test_fp16_session_runs_the_forward_in_float16_and_keeps_fp32_master_weights() -> None:
    work = MLPWorkload(steps=1)
    module = work.build_module(0)
    seen: list[torch.dtype] = []
    module[2].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))

    def loss_fn(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return work.loss(m(x), y) * y.numel(), torch.tensor(y.numel())

    session = get_training_backend("torch_native").prepare(module, plan=ParallelPlan(), loss_fn=loss_fn,
                                                          optimizer=work.make_optimizer, precision="fp16")
    x, y = work.global_batch(0, 0)
    receipt = session.train_batch(x, y)
    assert receipt.precision == "fp16" and seen and set(seen) == {torch.float16}
    assert all(p.dtype == torch.float32 for p in session.module.parameters())
    after = {f"param/{n}": p.detach() for n, p in session.module.named_parameters()}
    session.close()
    fp16_ref, fp32_ref = work.reference(0, "fp16")[0], work.reference(0, "fp32")[0]
    tol = default_tolerance("fp16")
    assert (tol.rtol, tol.atol) == (1e-3, 1e-5) and MIXED_SCALED_NOTE in tol.source
    for key, value in after.items():  # the session follows the fp16 reference's policy ...
        assert compare(value, fp16_ref[key], tol, scaled=True).within, key
    # ... and that policy really rounds in float16: its output is not the fp32 run's, bit for bit
    assert not np.array_equal(fp16_ref["output"], fp32_ref["output"])
    assert fp16_ref["output"].dtype == np.float32  # widened by to_numpy from float16
