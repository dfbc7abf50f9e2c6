"""The process group prepare() creates from torchrun's variables outlives session.close(), as in mixle 0.8.2,
so a mixle script's own ``dist.all_gather`` / ``dist.destroy_process_group()`` after close() still works."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
import torch.distributed as dist  # noqa: E402

from mixle_parallel.contracts import ParallelPlan  # noqa: E402
from mixle_parallel.executors import get_training_backend  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_group_created_by_prepare_is_left_to_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not dist.is_initialized()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)  # what torchrun sets for a one-rank job
    try:
        model = torch.nn.Linear(4, 3)
        session = get_training_backend("torch_native").prepare(model, plan=ParallelPlan(), device="cpu",
                                                               optimizer="sgd", loss_fn=_mse)
        assert session.owns_process_group and dist.is_initialized()
        session.train_batch(torch.ones(2, 4), torch.zeros(2, 3))
        session.close()
        assert dist.is_initialized()  # close() leaves it: the script may still use it
        gathered = [torch.zeros(1)]
        dist.all_gather(gathered, torch.ones(1))
        assert gathered[0].item() == 1.0
        dist.destroy_process_group()  # a mixle script's own teardown does not fail
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _mse(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    return torch.nn.functional.mse_loss(module(x), y, reduction="sum"), y.shape[0]
