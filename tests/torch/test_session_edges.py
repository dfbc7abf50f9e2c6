"""mixle 0.8.2's session edges: a save or a close while gradients are pending is refused with a RuntimeError."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _session(seed: int = 0):
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import TinyLM

    torch.manual_seed(seed)
    return get_training_backend("torch_native").prepare(
        TinyLM(), plan=ParallelPlan(gradient_accumulation_steps=2), optimizer="SGD", lr=0.1)


def _micro_step(session) -> None:
    from tests.torch._models import SEQ, VOCAB

    tokens = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(0))
    session.train_batch(tokens[:, :-1], tokens[:, 1:])


def test_save_checkpoint_during_pending_accumulation_raises_a_runtime_error(tmp_path):
    from mixle_parallel.torch_training import PendingGradientsError

    session = _session()
    _micro_step(session)
    assert session.pending_accumulation == 1
    with pytest.raises(RuntimeError, match="finish gradient accumulation") as err:  # mixle code catches RuntimeError
        session.save_checkpoint(str(tmp_path / "ck"))
    assert isinstance(err.value, (PendingGradientsError, ValueError))
    assert not (tmp_path / "ck").exists()
    assert session.pending_accumulation == 1  # nothing was dropped by the refusal
    session.finish_accumulation()
    session.close()


def test_close_with_pending_gradients_raises_and_leaves_the_session_usable():
    session = _session()
    _micro_step(session)
    with pytest.raises(RuntimeError, match="finish_accumulation.*discard_accumulation"):
        session.close()
    _micro_step(session)  # still open: the second micro-batch commits the window
    assert (session.step, session.pending_accumulation) == (1, 0)
    session.close()
    session.close()  # idempotent once closed


def test_close_after_discarding_pending_gradients_succeeds():
    session = _session()
    _micro_step(session)
    assert session.discard_accumulation() is not None
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        _micro_step(session)
