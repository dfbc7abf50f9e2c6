"""CUDA check for checkpoints: async save of an FSDP2 model on a GPU under a cpu:gloo,cuda:nccl group.

Needs one CUDA device; skipped on CPU-only machines. Run: ``pytest -m device tests/device``.
What it proves on a GPU (the CPU tests cannot): DCP stages CUDA tensors to CPU before
``async_save`` returns, the background write runs over the checkpoint module's gloo group while
training issues NCCL collectives, the loaded state is the state at the save call, and the
current CUDA device's RNG state is restored.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _build(mesh, seed: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _step(model, optimizer, step: int) -> float:
    gen = torch.Generator(device="cuda").manual_seed(step)
    x = torch.randn(16, 32, device="cuda", generator=gen)
    y = torch.randn(16, 8, device="cuda", generator=gen)
    optimizer.zero_grad(set_to_none=True)
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss.item()


def _params(model) -> list:
    return [p.full_tensor().detach().cpu().clone() for p in model.parameters()]


def test_async_save_on_cuda_with_nccl_training(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from mixle_parallel.executors.torch.checkpoint import load_checkpoint, save_checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",))
        model, optimizer = _build(mesh, seed=0)
        for s in range(3):
            _step(model, optimizer, s)
        at_save = _params(model)
        handle = save_checkpoint(tmp_path, model=model, optimizer=optimizer,
                                 session_state={"step": 3, "pending_accumulation": 0}, asynchronous=True)
        cuda_draw = torch.rand(4, device="cuda").cpu()
        reference = [_step(model, optimizer, s) for s in range(3, 6)]  # training goes on meanwhile
        handle.wait()
        assert (tmp_path / "LATEST").is_file()

        fresh, fresh_opt = _build(mesh, seed=9)
        loaded = load_checkpoint(tmp_path, model=fresh, optimizer=fresh_opt)
        assert loaded["rng"] == "restored"
        assert torch.equal(torch.rand(4, device="cuda").cpu(), cuda_draw)  # CUDA RNG restored
        assert all(torch.equal(a, b) for a, b in zip(_params(fresh), at_save))  # state at the call
        resumed = [_step(fresh, fresh_opt, s) for s in range(3, 6)]
        # same device, same kernels; tolerance for cuBLAS algorithm choice: rtol 1e-5, atol 1e-6
        assert resumed == pytest.approx(reference, rel=1e-5, abs=1e-6)
    finally:
        dist.destroy_process_group()
