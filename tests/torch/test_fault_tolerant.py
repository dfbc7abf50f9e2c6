"""fault_tolerant_training's loader positions and background snapshots (mixle's names), one process."""

from __future__ import annotations

import pathlib

import pytest
import torch

from mixle_parallel.fault_tolerant_training import (
    AsyncCheckpointHandle,
    LoaderState,
    load_checkpoint,
    load_checkpoint_extra,
    resume_batches,
    save_checkpoint_async,
    synthetic_batch_for_state,
)


class Corpus:
    """mixle's StreamingCorpus contract: epoch_batches(epoch) is a pure function of (seed, epoch)."""

    def epoch_batches(self, epoch: int):
        g = torch.Generator().manual_seed(100 + epoch)
        for _ in range(6):
            yield torch.randint(0, 9, (2, 3), generator=g)


def test_loader_state_and_resume() -> None:
    s = LoaderState(seed=1, epoch=2, rank=0, world_size=2, batch_idx=0)
    assert s.advanced(3).batch_idx == 3 and LoaderState.from_dict(s.advanced(3).to_dict()) == s.advanced(3)
    with pytest.raises(ValueError, match="rank=2 must be < world_size=2"):
        LoaderState(1, 0, 2, 2)
    full = list(Corpus().epoch_batches(2))
    resumed = list(resume_batches(Corpus(), s.advanced(4)))
    assert len(resumed) == 2 and all(torch.equal(a, b) for a, b in zip(resumed, full[4:]))  # no batch skipped
    with pytest.raises(ValueError, match="fewer than batch_idx=9"):
        resume_batches(Corpus(), s.advanced(9))
    a, b = synthetic_batch_for_state(s, vocab=7, block=4, batch_size=3), synthetic_batch_for_state(
        s, vocab=7, block=4, batch_size=3)
    assert torch.equal(a[0], b[0]) and a[0].shape == (3, 4) and a[1].shape == (3,)
    assert not torch.equal(a[0], synthetic_batch_for_state(s.advanced(), vocab=7, block=4, batch_size=3)[0])


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_async_snapshot_round_trip(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, opt = _model()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = LoaderState(seed=3, epoch=1, rank=0, world_size=1, batch_idx=5)
    handle = save_checkpoint_async(model, opt, str(tmp_path / "ck"), state, extra={"note": "x"})
    assert isinstance(handle, AsyncCheckpointHandle) and handle.prepare_time_s >= 0
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on; the staged snapshot is not affected
    handle.wait(timeout=120)
    assert handle.done
    torch.manual_seed(1)
    other, other_opt = _model()
    assert load_checkpoint(other, other_opt, str(tmp_path / "ck")) == state
    assert torch.equal(other.weight + 1.0, model.weight)
    assert load_checkpoint_extra(str(tmp_path / "ck")) == {"note": "x"}


def test_stateful_dataloader_state_travels(tmp_path: pathlib.Path) -> None:
    torchdata = pytest.importorskip("torchdata.stateful_dataloader",
                                    reason="torchdata's StatefulDataLoader (the [ci] extra) is not installed")
    loader = torchdata.StatefulDataLoader(list(range(10)), batch_size=2)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(2)]
    model, opt = _model()
    save_checkpoint_async(model, opt, str(tmp_path / "ck"), loader).wait()
    fresh = torchdata.StatefulDataLoader(list(range(10)), batch_size=2)
    load_checkpoint(model, opt, str(tmp_path / "ck"), loader=fresh)
    rest = [b.tolist() for b in fresh]
    assert seen == [[0, 1], [2, 3]] and rest == [[4, 5], [6, 7], [8, 9]]  # no batch skipped or repeated
