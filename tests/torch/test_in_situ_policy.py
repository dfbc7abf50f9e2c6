"""In-situ certification respects the trust store's policy (issue 23 items 1 and 2), decided before any process group.

A launched run (torchrun's variables set) with no certificate: ``keys policy off`` refuses with the exact
``mixle-parallel certify`` command; ``trusted-keys-only`` on a machine without a signing key refuses naming
``mixle-parallel keys init`` and makes no key. Outside a launched job nothing is certified in situ.
"""

from __future__ import annotations

import pytest
import torch

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.executors.training_in_situ import launched, launcher_name
from mixle_parallel.verification.keys import TrustStore
from tests.torch._models import make_model

COMMAND = "`mixle-parallel certify --backend torch_native --plan dp_replicate=2 --precision fp32 --out cert.json`"


@pytest.fixture(autouse=True)
def launched_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> TrustStore:
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    return TrustStore(tmp_path / "home")


def _prepare() -> None:
    get_training_backend("torch_native").prepare(make_model(), plan=ParallelPlan(dp_replicate=2), optimizer="SGD",
                                                 lr=0.1)


def test_policy_off_refuses_with_the_command(launched_env: TrustStore) -> None:
    launched_env.set_policy("off")
    with pytest.raises(NotAdmittedError) as info:
        _prepare()
    assert "automatic certification is off" in str(info.value)
    assert COMMAND in str(info.value)
    assert not torch.distributed.is_initialized()


def test_trusted_keys_only_without_a_key_refuses_and_makes_none(launched_env: TrustStore) -> None:
    launched_env.set_policy("trusted-keys-only")
    with pytest.raises(NotAdmittedError, match="mixle-parallel keys init"):
        _prepare()
    assert not launched_env.has_signing_key()
    assert not torch.distributed.is_initialized()


def test_launch_detection() -> None:
    assert launched()
    assert not launched({})
    assert launcher_name({"TORCHELASTIC_RUN_ID": "x"}) == "torchrun"
    assert launcher_name({"PMI_RANK": "0"}) == "mpiexec"
    assert launcher_name({}) == "launched"
