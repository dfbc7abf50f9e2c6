"""dcp_checkpoint (mixle's names) over our checkpoints: TP, HSDP and DDP checkpoints reshard 4 -> 2 bit for bit."""

from __future__ import annotations

import pathlib

import pytest

from mixle_parallel.verification.harness.mesh import run_world
from tests.torch import _reshard_scenarios as sc

pytestmark = pytest.mark.slow


def test_tp_hsdp_ddp_checkpoints_reshard(tmp_path: pathlib.Path) -> None:
    saved = run_world(sc.save, 4, str(tmp_path), timeout=900, torchrun_env=True, backend="gloo",
                      group_timeout_s=300)
    loaded = run_world(sc.load, 2, str(tmp_path), timeout=900, torchrun_env=True, backend="gloo",
                       group_timeout_s=300)
    for name, _, _ in sc.CASES:
        assert len({tuple(r[name]) for r in saved}) == 1  # every saving rank sees the same full state
        for rank in loaded:
            got = rank[name]
            # full parameters and optimizer state after resharding: the same bits as saved
            assert tuple(got["digests"]) == tuple(saved[0][name]), name
            assert got["step"] == got["meta_step"] == 2 and got["extra"] == {"case": name}
            assert got["plan_ok"] and got["saved_world"] == 4


def test_bad_options_are_refused() -> None:
    from mixle_parallel.dcp_checkpoint import load_training_metadata, load_training_state, save_training_state

    with pytest.raises(ValueError, match="step must be an int"):
        save_training_state(None, None, "unused", step=-1)
    with pytest.raises(TypeError, match="rank_local_transform is not taken"):
        load_training_metadata("unused", rank_local_transform=lambda *a: {})
    with pytest.raises(ValueError, match="restore_rng=False"):
        load_training_state(None, None, "unused", restore_rng=False)


def test_single_process_round_trips(tmp_path: pathlib.Path) -> None:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from mixle_parallel.dcp_checkpoint import (
        AsyncTrainingCheckpoint,
        async_save_training_state,
        load_sharded,
        load_training_state,
        save_frozen_training_state,
        save_sharded,
    )

    def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        return model, opt

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = trained()
    save_sharded(model, opt, str(tmp_path / "sharded"))
    frozen = get_state_dict(model, opt)
    save_frozen_training_state(*frozen, str(tmp_path / "frozen"), step=7, extra={"k": 1})
    handle = async_save_training_state(model, opt, str(tmp_path / "async"), step=3)
    assert isinstance(handle, AsyncTrainingCheckpoint)
    handle.wait()
    assert handle.done
    for name, step in (("sharded", 0), ("frozen", 7), ("async", 3)):
        other, other_opt = fresh()
        if name == "sharded":
            load_sharded(other, other_opt, str(tmp_path / name))
        else:
            assert load_training_state(other, other_opt, str(tmp_path / name))["step"] == step
        assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)
        momentum = other_opt.state[other.weight]["momentum_buffer"]
        assert torch.equal(momentum, opt.state[model.weight]["momentum_buffer"])
