"""The same tiny DDP training (torch_native session inside) through torchrun, Fabric and Ray Train.

Every launcher must end with bitwise identical parameters: same seeds, same data shares, same
kernels (one thread), and a two-rank gloo all-reduce whose sum does not depend on the order. The
single-process reference trains on each whole global batch; it differs only by fp32 rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# fp32 after 3 SGD-with-momentum steps: the reference averages 8 examples in one sum, DDP sums
# two 4-example halves. Observed: 3.0e-8 on parameters, 1.2e-7 on the (float32) losses.
ATOL, RTOL = 1e-6, 1e-5


def test_launchers_end_with_identical_parameters(
    torchrun_records: list[dict[str, Any]], fabric_records: list[dict[str, Any]],
    ray_records: list[dict[str, Any]], tiny_ddp: Any,
) -> None:
    params = {name: records[0]["params"] for name, records in
              (("torchrun", torchrun_records), ("fabric", fabric_records), ("ray", ray_records))}
    assert params["torchrun"] == params["fabric"] == params["ray"]  # bitwise (JSON floats round-trip exactly)
    assert torchrun_records[0]["losses"] == fabric_records[0]["losses"] == ray_records[0]["losses"]

    reference = tiny_ddp.reference()
    assert reference["params"].keys() == params["torchrun"].keys()
    for name, value in reference["params"].items():
        np.testing.assert_allclose(np.array(params["torchrun"][name]), np.array(value), rtol=RTOL, atol=ATOL,
                                   err_msg=name)
    np.testing.assert_allclose(torchrun_records[0]["losses"], reference["losses"], rtol=RTOL, atol=ATOL)
    # the training moved the parameters: the comparison is not between untouched initial weights
    initial = {n: p.detach().tolist() for n, p in tiny_ddp.make_model().named_parameters()}
    assert all(not np.allclose(initial[n], v, atol=1e-3) for n, v in reference["params"].items())
