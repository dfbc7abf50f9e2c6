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


def test_a_token_handle_frees_what_training_left_in_cycles_before_destroying_its_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``StreamingTokenEncodedData.close`` destroys the group it created once the cycles a run left (a DDP
    module's reducer holds the group's threads) are freed: left to the interpreter's exit, their C++ teardown
    aborted a torchrun rank of docs/training.md's example (3 of 8 runs before, 0 of 16 after)."""
    import gc
    import weakref

    from mixle_parallel.torch_neural import StreamingTokenEncodedData

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    gc.disable()  # only the close may collect the cycle
    try:
        handle = StreamingTokenEncodedData(list(range(40)), block=4, batch_size=8, admission="unverified")
        assert handle.owns_process_group and dist.is_initialized()
        cycle = _Held()
        cycle.me = cycle
        freed = weakref.ref(cycle)
        del cycle
        assert freed() is not None
        handle.close()
        assert freed() is None and not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


class _Held:
    me: object = None
