"""Checkpoints in one process (torch.distributed not initialized): round trip, refusals, JSON only."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.executors.torch.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_manifest import (  # noqa: E402
    CheckpointError,
    CorruptCheckpointError,
)


def _build(seed: int = 0, dampening: float = 0.0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=dampening)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler, step: int) -> float:
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen)
    optimizer.zero_grad()
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _save(path, model, optimizer, scheduler, step, **kwargs):
    return save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler,
                           session_state={"step": step, "pending_accumulation": 0}, **kwargs)


def test_round_trip_resumes_exactly(tmp_path):
    model, optimizer, scheduler = _build()
    for s in range(3):
        _step(model, optimizer, scheduler, s)
    random.seed(11)
    np.random.seed(12)
    handle = _save(tmp_path, model, optimizer, scheduler, 3, loader_state={"samples": 18},
                   typed_scheduler_state={"warmup": (0, 2)}, extra={"best": float("inf")})
    assert handle.done() and handle.wait() == tmp_path / "gen-00000001"
    draws = (torch.rand(2).tolist(), random.random(), np.random.rand())
    reference = [_step(model, optimizer, scheduler, s) for s in range(3, 7)]

    fresh = _build(seed=5)
    loaded = load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    assert loaded["session_state"] == {"step": 3, "pending_accumulation": 0}
    assert loaded["loader_state"] == {"samples": 18}
    assert loaded["typed_scheduler_state"] == {"warmup": (0, 2)}
    assert loaded["extra"] == {"best": float("inf")}
    assert (loaded["saved_world_size"], loaded["rng"]) == (1, "restored")
    assert (torch.rand(2).tolist(), random.random(), np.random.rand()) == draws  # every RNG restored
    resumed = [_step(*fresh, s) for s in range(3, 7)]
    assert resumed == reference  # same process, same kernels: bitwise equal
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), _params(model)))


def test_everything_written_is_json_and_only_tensors_reach_dcp(tmp_path):
    model, optimizer, scheduler = _build()
    _step(model, optimizer, scheduler, 0)
    gen = _save(tmp_path, model, optimizer, scheduler, 1).wait()
    for file in [tmp_path / "LATEST", *gen.rglob("*.json")]:
        json.loads(file.read_text())  # strict JSON
    state = json.loads((gen / "state.json").read_text())
    assert state["optimizer"]["param_groups"][0]["momentum"] == 0.9  # hyper-parameters in JSON
    assert set(state["tensors"]) == {
        *(f"model[{k!r}]" for k in model.state_dict()),
        *(f"optimizer['state'][{k!r}]['momentum_buffer']" for k in model.state_dict())}
    metadata = torch.distributed.checkpoint.FileSystemReader(str(gen / "dcp")).read_metadata()
    kinds = {type(m).__name__ for m in metadata.state_dict_metadata.values()}
    assert kinds == {"TensorStorageMetadata"}  # no pickled BytesIO objects inside DCP


def test_save_before_first_step_leaves_optimizer_untouched(tmp_path):
    # get_state_dict initializes empty optimizer state with a zero-lr step; with dampening that
    # would change the next update, so the save must undo it.
    model, optimizer, scheduler = _build(dampening=0.5)
    twin = _build(dampening=0.5)
    _save(tmp_path, model, optimizer, scheduler, 0)
    assert not optimizer.state
    assert [_step(model, optimizer, scheduler, s) for s in range(2)] == [_step(*twin, s) for s in range(2)]
    fresh = _build(seed=3, dampening=0.5)
    load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    again = _build(dampening=0.5)
    assert [_step(*fresh, s) for s in range(2)] == [_step(*again, s) for s in range(2)]


def test_latest_generation_wins_and_older_ones_stay_loadable(tmp_path):
    model, optimizer, scheduler = _build()
    _save(tmp_path, model, optimizer, scheduler, 0)
    first = _params(model)
    _step(model, optimizer, scheduler, 0)
    _save(tmp_path, model, optimizer, scheduler, 1)
    fresh = _build(seed=2)
    assert load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1])["generation"] == "gen-00000002"
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), _params(model)))
    old = load_checkpoint(tmp_path / "gen-00000001", model=fresh[0], optimizer=fresh[1])
    assert old["session_state"]["step"] == 0
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), first))


@pytest.mark.parametrize("damage", ["flip_tensor_bytes", "delete_metadata", "torn_pointer", "edit_state"])
def test_corrupted_checkpoint_is_refused_and_nothing_changes(tmp_path, damage):
    model, optimizer, scheduler = _build()
    _step(model, optimizer, scheduler, 0)
    gen = _save(tmp_path / "ck", model, optimizer, scheduler, 1).wait()
    victim = {"flip_tensor_bytes": gen / "dcp" / "__0_0.distcp", "delete_metadata": gen / "dcp" / ".metadata",
              "torn_pointer": tmp_path / "ck" / "LATEST", "edit_state": gen / "state.json"}[damage]
    if damage == "delete_metadata":
        victim.unlink()
    elif damage == "torn_pointer":
        victim.write_bytes(victim.read_bytes()[:30])
    else:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    fresh = _build(seed=4)
    before = _params(fresh[0])
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(tmp_path / "ck", model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    assert info.value.path == str(victim) and str(victim) in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), before))
    assert not fresh[1].state


def test_unfinished_save_is_never_loaded(tmp_path):
    model, optimizer, scheduler = _build()
    _save(tmp_path, model, optimizer, scheduler, 0)
    shutil.copytree(tmp_path / "gen-00000001", tmp_path / "gen-00000002")  # a crash before publishing:
    (tmp_path / "gen-00000002" / "MANIFEST.json").unlink()  # no manifest, pointer not flipped
    fresh = _build(seed=1)
    assert load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1])["generation"] == "gen-00000001"
    with pytest.raises(CorruptCheckpointError, match="manifest is missing"):
        load_checkpoint(tmp_path / "gen-00000002", model=fresh[0], optimizer=fresh[1])
    _step(model, optimizer, scheduler, 0)
    assert _save(tmp_path, model, optimizer, scheduler, 1).generation == "gen-00000003"


def test_state_that_is_not_json_is_refused_before_writing(tmp_path):
    model, optimizer, scheduler = _build()
    with pytest.raises(CheckpointError, match=r"extra\['callback'\].*never pickle"):
        _save(tmp_path, model, optimizer, scheduler, 0, extra={"callback": lambda: 0})
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_scheduler_state_with_infinities_round_trips(tmp_path):
    model, optimizer, _ = _build()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    for metric in (1.0, 2.0, 3.0):
        plateau.step(metric)
    _save(tmp_path, model, optimizer, plateau, 0)
    fresh = _build(seed=1)
    twin = torch.optim.lr_scheduler.ReduceLROnPlateau(fresh[1], patience=0)
    load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=twin)
    assert twin.state_dict() == plateau.state_dict()
    assert fresh[1].param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_mismatched_model_or_missing_scheduler_state_is_refused(tmp_path):
    model, optimizer, scheduler = _build()
    _save(tmp_path / "a", model, optimizer, None, 0)
    with pytest.raises(CheckpointError, match="holds no scheduler state"):
        load_checkpoint(tmp_path / "a", model=model, optimizer=optimizer, scheduler=scheduler)
    wider = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))
    with pytest.raises(CheckpointError, match=r"global shape \[8\] in the checkpoint and \[9\] here"):
        load_checkpoint(tmp_path / "a", model=wider, optimizer=torch.optim.SGD(wider.parameters(), lr=0.1))
    other = torch.nn.Sequential(torch.nn.Linear(4, 2))
    with pytest.raises(CheckpointError, match="same architecture"):
        load_checkpoint(tmp_path / "a", model=other, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


def test_async_save_in_one_process_saves_the_state_at_the_call(tmp_path):
    model, optimizer, scheduler = _build()
    _step(model, optimizer, scheduler, 0)
    at_save = _params(model)
    handle = _save(tmp_path, model, optimizer, scheduler, 1, asynchronous=True)
    _step(model, optimizer, scheduler, 1)  # in-place updates after staging do not reach the save
    assert handle.wait() == tmp_path / "gen-00000001" and handle.done()
    fresh = _build(seed=8)
    assert load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1])["session_state"]["step"] == 1
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), at_save))


def test_mixles_markers_follow_the_published_generation_only(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    model, optimizer, scheduler = _build()
    _save(tmp_path, model, optimizer, scheduler, 0)
    _step(model, optimizer, scheduler, 0)
    _save(tmp_path, model, optimizer, scheduler, 1)
    current = json.loads((tmp_path / "CURRENT").read_text())
    assert current == json.loads((tmp_path / "LATEST").read_text()) and current["generation"] == "gen-00000002"
    assert json.loads((tmp_path / "_SUCCESS").read_text())["generation"] == "gen-00000002"
    assert (tmp_path / "gen-00000001" / "_SUCCESS").is_file() and (tmp_path / "gen-00000002" / "_SUCCESS").is_file()

    def failing_write(*args, **kwargs):
        raise RuntimeError("disk full (injected)")

    monkeypatch.setattr(dcp, "save", failing_write)
    with pytest.raises(RuntimeError, match="disk full"):
        _save(tmp_path, model, optimizer, scheduler, 2)
    monkeypatch.undo()
    assert json.loads((tmp_path / "CURRENT").read_text())["generation"] == "gen-00000002"  # markers untouched
    assert json.loads((tmp_path / "_SUCCESS").read_text())["generation"] == "gen-00000002"
    assert not (tmp_path / "gen-00000003" / "_SUCCESS").exists()
    fresh = _build(seed=3)
    assert load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[1])["session_state"]["step"] == 1
